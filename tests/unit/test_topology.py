"""The topology is declared once (services/_kernel/wire/topology.py) and everything else reads it (issue 18).

A service added to the declaration, with an app of its own (this module's `build`), shows up in the AsyncAPI
document, in the topics `roundtrip topics create` makes and in the consumer groups `roundtrip lag` shows, with
no other edit; a subscription or an output the declaration does not have fails when the app is built.
"""

from __future__ import annotations

import importlib

import pytest
from faststream import FastStream

from roundtrip._cli import contracts
from roundtrip._kernel.kafka.admin import desired_topics
from roundtrip._kernel.kafka.messaging import Outlet, subscribe, wiring
from roundtrip._kernel.observability import health
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import events, topics, topology
from roundtrip._sdk.agent import load_agent

ECHOES = "test.echoes"
ECHOED = "test.echoed"
ECHO = topology.Service(
    "echo",
    "a test app: repeats what it hears",
    inputs=(topology.Input(ECHOES, events.CancelTurn),),
    outputs={ECHOED: events.CancelTurn},
    app=__name__,
)


def build(settings: Settings, agent: object) -> FastStream:  # a service of its own: builds like the five
    wired = wiring("echo", settings, (), "")
    echoed = Outlet(wired, ECHOED, events.CancelTurn, "")

    @subscribe(wired, ECHOES, settings)
    async def on_echo(command: events.CancelTurn) -> None:
        await echoed(command, command.turn_id)

    return FastStream(wired.broker)


@pytest.fixture
def with_echo(monkeypatch):
    monkeypatch.setattr(topology, "SERVICES", (*topology.SERVICES, ECHO))


def settings() -> Settings:
    return Settings(_env_file=None)


def test_a_service_added_to_the_declaration_shows_up_everywhere(with_echo):
    channels = contracts.asyncapi_document()["channels"]
    assert any(ECHOES in name for name in channels) and any(ECHOED in name for name in channels)
    assert {"p." + ECHOES, "p." + ECHOED} <= set(desired_topics("p.", 3, None, ()))  # topics create
    assert topology.groups("")["roundtrip-echo"] == ECHOES  # roundtrip lag
    assert (
        topology.names()[-1] == "echo"
        and health.port_candidates(
            "echo", settings().model_copy(update={"health_port": 9000, "health_port_per_service": True})
        )[0]
        == 9000 + len(topology.SERVICES) - 1
    )


def test_a_fleets_groups_carry_its_topic_prefix_and_are_found_by_their_short_names():
    assert topology.group("guard", "starts") == "roundtrip-guard-starts"
    assert topology.group("guard", "starts", "prod.") == "prod.roundtrip-guard-starts"
    prod = topology.groups("prod.")
    assert (
        set(prod) == {"prod." + g for g in topology.groups("")}
        and prod["prod.roundtrip-executor"] == topology.groups("")["roundtrip-executor"]
    )
    for name in ("executor", "roundtrip-executor", "prod.roundtrip-executor"):
        assert topology.find_group(name, "prod.") == "prod.roundtrip-executor"
    assert topology.find_group("roundtrip-executor", "") == "roundtrip-executor"
    assert topology.find_group("prod.roundtrip-executor", "") is None  # another fleet's group is not this fleet's
    assert topology.find_group("nosuch", "prod.") is None


def test_every_app_builds_against_its_declaration():
    for declared in topology.SERVICES:
        importlib.import_module(declared.app_module).build(settings(), load_agent())


def test_a_subscription_the_topology_does_not_declare_fails_at_build():
    wired = wiring("model", settings(), (), "")
    with pytest.raises(LookupError, match=r"declares no subscription of model to turn.tool_calls"):
        subscribe(wired, topics.TOOL_CALLS, settings())


def test_a_handler_for_another_message_than_declared_fails_at_build():
    wired = wiring("model", settings(), (), "")

    with pytest.raises(TypeError, match=r"the topology says turn.model_calls carries CallModel"):

        @subscribe(wired, topics.MODEL_CALLS, settings())
        async def on_call(command: events.CancelTurn) -> None: ...


def test_an_output_the_topology_does_not_declare_fails_at_build():
    wired = wiring("gate", settings(), (), "")
    with pytest.raises(LookupError, match=r"declares no output CallModel of gate to turn.model_calls"):
        Outlet(wired, topics.MODEL_CALLS, events.CallModel, "")


def test_every_topic_is_one_of_the_declared_names_and_the_ledger_sharers_are_declared():
    assert len(set(topology.topic_names())) == len(topology.topic_names())
    assert topics.SUPPORT_REQUESTS in topology.topic_names()
    # each service that consumes has its own dead letters; the shared topic of older fleets is read, never made
    assert [t for t in topology.topic_names() if t.startswith(topics.DEAD_LETTERS)] == [
        topics.DEAD_LETTERS_HANDLED,
        *(f"roundtrip.dead_letters.by.{s}" for s in ("gateway", "model", "guard", "gate", "executor")),
    ]
    assert topology.service("console").dead_letters is None and topics.DEAD_LETTERS not in topology.topic_names()
    assert {s.name for s in topology.SERVICES if s.shares_ledger} == {
        "gateway",
        "model",
        "guard",
        "gate",
        "executor",
        "console",
    }
    with pytest.raises(LookupError, match="the fleet's services are gateway, model, guard, gate, executor, console"):
        topology.service("nosuch")


def test_dead_letters_are_re_driven_only_to_consumed_topics_and_their_handling_is_one_ordered_topic():
    consumed = {i.topic for s in topology.SERVICES for i in s.inputs}
    assert set(topology.redrive_topics()) == consumed and topics.SUPPORT_REPLIES not in consumed
    assert [s.name for s in topology.SERVICES if s.redrives] == ["console"]
    assert topics.DEAD_LETTERS_HANDLED in topology.topic_names()
    counts = desired_topics("p.", 6, None, ())
    assert counts["p." + topics.DEAD_LETTERS_HANDLED] == 1  # one order of claims: the first claim of a letter wins
    assert topology.consumed_by("executor") == (topics.TOOL_BATCHES,) and topology.consumed_by("console") == ()
    for name in topology.service("console").reads:
        assert name in topology.topic_names()
