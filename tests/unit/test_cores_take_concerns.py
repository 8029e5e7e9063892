"""The cores and the kernel's helpers take the settings they read, not the whole `Settings`: each is built here from
an object holding only the fields its parameter's type names, so a read of any other setting fails."""

from __future__ import annotations

import typing
from types import SimpleNamespace

import pytest

from roundtrip import load_agent
from roundtrip._console import auth, decisions
from roundtrip._executor import core as executor_core
from roundtrip._gate import core as gate_core
from roundtrip._kernel.observability import telemetry, traces
from roundtrip._kernel.settings import ApprovalSettings, Settings
from roundtrip._model import batches, client, providers
from roundtrip._sdk.context import Dependencies


def names(protocol: type) -> set[str]:
    """The fields and properties `protocol` declares, its own and its bases'."""
    declared: set[str] = set()
    for cls in protocol.__mro__:
        if cls.__module__.startswith("roundtrip."):
            declared |= set(vars(cls).get("__annotations__", {}))
            declared |= {name for name, value in vars(cls).items() if isinstance(value, property)}
    return declared


def only(protocol: type, settings: Settings) -> SimpleNamespace:
    return SimpleNamespace(**{name: getattr(settings, name) for name in names(protocol)})


@pytest.fixture
def settings(tmp_path):
    return Settings(_env_file=None, state_dir=tmp_path)


@pytest.mark.parametrize(
    "function, parameter, protocol",
    [
        (providers.in_effect, "settings", providers.ModelAccess),
        (client.ModelClient.__init__, "settings", client.ClientSettings),
        (batches.BatchLane.__init__, "settings", batches.LaneConcerns),
        (executor_core.runner_for, "settings", executor_core.RunnerSettings),
        (gate_core.gate_for, "settings", gate_core.GateConfig),
        (auth.Gatekeeper.__init__, "settings", auth.SignIn),
        (telemetry.setup_telemetry, "settings", telemetry.SpanExport),
        (traces.read, "settings", traces.SpanSources),
        (decisions.decision_signer, "settings", ApprovalSettings),
    ],
)
def test_each_takes_the_type_that_names_what_it_reads(function, parameter, protocol):
    assert typing.get_type_hints(function)[parameter] is protocol
    assert names(protocol) <= {*Settings.model_fields, *dir(Settings)}  # the whole fits where a part is asked for


def test_the_model_client_is_built_from_the_model_settings_alone(settings):
    model = client.ModelClient(only(client.ClientSettings, settings), [], "system", settings.model, 0)
    assert model.model == settings.model and model.tool_choice(None) is None
    part = only(providers.ModelAccess, settings)
    providers.refuse_unusable(part, settings.model)
    assert dict(providers.in_effect(part))["provider"] == "anthropic"


def test_the_gate_and_the_runner_are_built_from_their_settings_alone(settings):
    agent = load_agent(None)
    gate = gate_core.gate_for(agent, only(gate_core.GateConfig, settings), Dependencies())
    assert gate.batch_ttl_s == settings.stuck_after_s
    tools = executor_core.runner_for(only(executor_core.RunnerSettings, settings), agent, Dependencies())
    assert tools.parallel == settings.parallel_tools


def test_the_consoles_parts_are_built_from_their_settings_alone(settings):
    gate = auth.Gatekeeper(only(auth.SignIn, settings))
    assert gate.issuer is None and gate.local == settings.console_local_identity
    assert decisions.decision_signer(ApprovalSettings(_env_file=None)) is not None


def test_spans_are_exported_and_read_from_the_telemetry_settings_alone(settings):
    with pytest.raises(traces.TraceUnreadable, match="no span file"):
        traces.read(only(traces.SpanSources, settings), "turn_none")
    telemetry.make_provider("unit", only(telemetry.SpanExport, settings)).shutdown()
    assert traces.read(only(traces.SpanSources, settings), "turn_none") == ("turn_none", [])  # the file it opened
