"""`roundtrip acls`: each service's principal gets what the topology says it reads and writes, and nothing more."""

from __future__ import annotations

import shlex

from roundtrip._kernel.kafka import acls
from roundtrip._kernel.wire import topics, topology


def acls_of(prefix: str = "", principal: str = acls.DEFAULT_PRINCIPAL, app_group: str | None = None) -> dict:
    """The ACLs `roundtrip acls` derives, with the defaults of its command line."""
    return acls.derive(prefix, principal, app_group, ())


def derived_for(prefix: str, versions: tuple[str, ...] = ()) -> dict:
    """The ACLs derived for a fleet with these agent versions beside the default one."""
    return acls.derive(prefix, acls.DEFAULT_PRINCIPAL, None, versions)


def _allowed(derived: list[acls.Acl], kind: str, name: str, operation: str) -> bool:
    return any(
        a.kind == kind and (name.startswith(a.name) if a.prefixed else a.name == name) and operation in a.operations
        for a in derived
    )


def test_the_executor_reads_only_its_batches_and_writes_only_its_outputs() -> None:
    executor = acls_of()["executor"]
    assert _allowed(executor, "topic", topics.TOOL_BATCHES, "Read")
    assert _allowed(executor, "group", "roundtrip-executor", "Read")
    for written in (topics.MODEL_CALLS, topics.APPROVAL_REQUESTS, topics.dead_letters("executor")):
        assert _allowed(executor, "topic", written, "Write")
    for others in (topics.dead_letters("guard"), topics.dead_letters("gateway"), topics.DEAD_LETTERS):
        assert not _allowed(executor, "topic", others, "Write")  # no letter it writes says another service wrote it
    assert not _allowed(executor, "topic", topics.TOOL_BATCHES, "Write")  # it cannot forge its own work
    assert not _allowed(executor, "topic", topics.SUPPORT_REQUESTS, "Read")  # nor read the customers' requests
    assert not _allowed(executor, "topic", topics.SUPPORT_REPLIES, "Read")
    assert not any(a.kind == "transactional-id" for a in executor)


def test_every_declared_input_and_output_is_granted_to_its_service_only() -> None:
    derived = acls_of(prefix="acme.")
    for service in topology.SERVICES:
        mine = derived[service.name]
        assert {a.principal for a in mine} == {f"User:roundtrip-{service.name}"}
        for i in service.inputs:
            assert _allowed(mine, "topic", "acme." + i.topic, "Read") and _allowed(
                mine, "group", i.group(service.name, "acme."), "Read"
            )
        for t in service.outputs:
            assert _allowed(mine, "topic", "acme." + t, "Write")
        read = {a.name for a in mine if a.kind == "topic" and "Read" in a.operations}
        redriven = topology.redrive_topics() if service.redrives else ()
        letters = (*topology.dead_letter_topics(), topics.DEAD_LETTERS) if service.reads_dead_letters else ()
        expected = {"acme." + t for t in (*(i.topic for i in service.inputs), *service.reads, *letters, *redriven)} | (
            {"acme." + topics.SUPPORT_REPLIES} if service.name == "gateway" else set()
        )
        assert read == expected
        written = {a.name for a in mine if a.kind == "topic" and "Write" in a.operations}
        own = (service.dead_letters,) if service.dead_letters else ()
        assert written == {"acme." + t for t in (*service.outputs, *own, *redriven)}


def test_the_console_reads_the_dead_letters_and_re_drives_only_to_topics_the_fleet_consumes() -> None:
    console = acls_of(prefix="acme.")["console"]
    for read in (*topology.dead_letter_topics(), topics.DEAD_LETTERS, topics.DEAD_LETTERS_HANDLED):
        assert _allowed(console, "topic", "acme." + read, "Read")
    assert not any(_allowed(console, "topic", "acme." + t, "Write") for t in topology.dead_letter_topics())
    assert _allowed(console, "topic", "acme." + topics.DEAD_LETTERS_HANDLED, "Write")
    for source in (topics.SUPPORT_REQUESTS, topics.TOOL_BATCHES, topics.MODEL_CALLS, topics.APPROVAL_DECISIONS):
        assert _allowed(console, "topic", "acme." + source, "Write")
    for never in (topics.SUPPORT_REPLIES, topics.SUPPORT_STATUS, topics.TURN_EVENTS):  # no service consumes them
        assert not _allowed(console, "topic", "acme." + never, "Write")
    assert not any(a.kind == "group" for a in console)  # it reads with no consumer group
    # it reads a letter's record back from its source before it re-drives it, and no topic only a person reads
    assert _allowed(console, "topic", "acme." + topics.TOOL_BATCHES, "Read")
    assert not _allowed(console, "topic", "acme." + topics.SUPPORT_REPLIES, "Read")


def test_the_gateway_owns_its_transactional_ids_by_prefix() -> None:
    gateway = acls_of()["gateway"]
    assert _allowed(gateway, "transactional-id", "roundtrip-gateway-support.replies-pod-0", "Write")


def test_the_app_and_operator_principals() -> None:
    derived = acls_of(app_group="my-app", principal="User:{name}")
    app = derived["app"]
    assert _allowed(app, "topic", topics.SUPPORT_REQUESTS, "Write") and _allowed(
        app, "topic", topics.SUPPORT_REPLIES, "Read"
    )
    assert _allowed(app, "topic", topics.SUPPORT_STATUS, "Read")  # a turn waiting for a person, told to the app
    assert _allowed(app, "group", "my-app", "Read") and not _allowed(app, "topic", topics.TOOL_BATCHES, "Read")
    assert {a.principal for a in app} == {"User:app"}
    operator = derived["operator"]
    assert _allowed(operator, "topic", topics.APPROVAL_DECISIONS, "Write") and _allowed(
        operator, "group", "roundtrip-guard", "Describe"
    )


def test_render_prints_one_kafka_acls_command_per_resource() -> None:
    text = acls.render({"executor": acls_of()["executor"]}, "b1:9093,b2:9093", "admin.properties")
    lines = text.splitlines()
    assert lines[0] == "# executor: User:roundtrip-executor"
    for line in lines[1:]:
        argv = shlex.split(line)
        assert argv[:5] == [
            "kafka-acls.sh",
            "--bootstrap-server",
            "b1:9093,b2:9093",
            "--command-config",
            "admin.properties",
        ]
        assert "--add" in argv and argv[argv.index("--allow-principal") + 1] == "User:roundtrip-executor"
    assert len(lines) - 1 == len({(a.kind, a.name) for a in acls_of()["executor"]})


def test_the_deploy_readme_shows_what_roundtrip_acls_prints() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "deploy" / "README.md").read_text()
    printed = acls.render({"executor": acls_of()["executor"]}, "kafka-1:9093", "admin.properties")
    assert "$ roundtrip acls --command-config admin.properties --only executor\n" + printed in readme


def test_two_fleets_on_one_cluster_are_granted_nothing_of_each_others() -> None:
    """Prefixes `prod.` and none: every group, transactional id and topic one fleet's principals may touch is out of
    the other's reach (a prefixed ACL of one matches no name of the other)."""
    prod, plain = acls_of(prefix="prod."), acls_of()
    for service in topology.SERVICES:
        for i in service.inputs:
            assert _allowed(prod[service.name], "group", f"prod.{i.group(service.name)}", "Read")
            assert not _allowed(prod[service.name], "group", i.group(service.name), "Read")
            assert not _allowed(plain[service.name], "group", i.group(service.name, "prod."), "Read")
    txn = "roundtrip-gateway-support.replies-gw-0"
    assert _allowed(prod["gateway"], "transactional-id", "prod." + txn, "Write") and not _allowed(
        prod["gateway"], "transactional-id", txn, "Write"
    )
    assert not _allowed(plain["gateway"], "transactional-id", "prod." + txn, "Write")
    assert _allowed(prod["operator"], "group", "prod.roundtrip-guard", "Describe")
    assert not _allowed(prod["operator"], "group", "roundtrip-guard", "Describe")
    assert not _allowed(plain["operator"], "group", "prod.roundtrip-guard", "Describe")


def test_an_agent_versions_services_each_read_and_write_only_that_versions_own_topics() -> None:
    derived = derived_for(prefix="acme.", versions=("v2",))
    executor, gate, guard = derived["executor-v2"], derived["gate-v2"], derived["guard"]
    assert {a.principal for a in executor} == {"User:roundtrip-executor-v2"}
    assert _allowed(executor, "topic", "acme.turn.tool_batches.version.v2", "Read")
    assert _allowed(executor, "group", "acme.roundtrip-executor.version.v2", "Read")
    assert _allowed(executor, "topic", "acme.turn.model_calls.version.v2", "Write")
    assert _allowed(executor, "topic", "acme." + topics.APPROVAL_REQUESTS, "Write")  # shared: the guard reads it
    assert not _allowed(executor, "topic", "acme." + topics.TOOL_BATCHES, "Read")  # the default version's batches
    assert not _allowed(executor, "topic", "acme." + topics.MODEL_CALLS, "Write")
    assert _allowed(gate, "topic", "acme.turn.tool_batches.version.v2", "Write")
    assert not _allowed(gate, "topic", "acme." + topics.TOOL_BATCHES, "Write")
    for routed in ("acme.turn.model_calls.version.v2", "acme.turn.tool_calls.version.v2"):
        assert _allowed(guard, "topic", routed, "Write")
    assert _allowed(derived["operator"], "topic", "acme.turn.tool_batches.version.v2", "Create")
    assert derived_for(prefix="acme.")["guard"] == derived_for(prefix="acme.", versions=())["guard"]
    assert "executor-v2" not in derived_for(prefix="acme.")
