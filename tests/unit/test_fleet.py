"""`roundtrip up` fails fast and clearly when a port it needs is taken, and runs the demo shop only for its agent."""

import socket
from pathlib import Path

import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet, FleetError, demo_shop
from roundtrip._kernel.settings import Settings


def test_a_taken_port_is_reported_with_the_setting_that_moves_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(
            _env_file=None,
            state_dir=tmp_path,
            simulator_port=free_port(),
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
        )
        with pytest.raises(FleetError, match=rf"port {port} \(shop\) is already in use.*ROUNDTRIP_SHOP_PORT"):
            Fleet(settings, env={"ROUNDTRIP_SHOP_PORT": str(port)}).start()  # the demo shop agent's own setting
    assert not (tmp_path / "kafka").exists()  # nothing was started


def test_the_fleet_runs_the_demo_shop_only_for_the_shops_agent_without_a_shop_url(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "telecom-agent"))
    settings = Settings(_env_file=None, state_dir=tmp_path)
    assert demo_shop(settings, {"ROUNDTRIP_SHOP_PORT": "9911"}).shop_base_url == "http://127.0.0.1:9911"
    assert demo_shop(settings, {"ROUNDTRIP_SHOP_URL": "http://shop:8802"}) is None  # a shop of its own elsewhere
    assert demo_shop(Settings(_env_file=None, state_dir=tmp_path, agent="telecom_agent:AGENT"), {}) is None
    with pytest.raises(FleetError, match="ROUNDTRIP_SHOP_PORT"):
        demo_shop(settings, {"ROUNDTRIP_SHOP_PORT": "many"})
