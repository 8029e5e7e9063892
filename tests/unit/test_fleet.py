"""`roundtrip up` fails fast and clearly when a port it needs is taken."""

import socket

import pytest

from services.broker.embedded import free_port
from services.fleet import Fleet, FleetError
from services.kernel.settings import Settings


def test_a_taken_port_is_reported_with_the_setting_that_moves_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(_env_file=None, state_dir=tmp_path, simulator_port=free_port(),
                            kafka_port=free_port(), kafka_controller_port=free_port())
        with pytest.raises(FleetError, match=rf"port {port} \(shop\) is already in use.*ROUNDTRIP_SHOP_PORT"):
            Fleet(settings, env={"ROUNDTRIP_SHOP_PORT": str(port)}).start()  # the demo shop agent's own setting
    assert not (tmp_path / "kafka").exists()  # nothing was started
