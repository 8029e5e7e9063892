"""`roundtrip up` says Ready. when its services say they have started: whatever the log level, never on an
earlier run's log lines (issue 17). Each service tells `up` on a pipe of its own (services/_kernel/runtime.py).
"""

from __future__ import annotations

import httpx

from roundtrip._kernel.wire import topology
from tests.e2e.up_process import roundtrip_up
from tests.ports import free_port_run


def test_a_second_up_at_warning_level_in_the_same_folder_is_ready_only_when_its_services_are(tmp_path):
    with roundtrip_up(tmp_path) as (_, _, first):  # an earlier run: its services' logs say "started"
        assert "Ready." in first.read_text()
    logs = tmp_path / "state" / "logs"
    assert b" started (broker" in (logs / "model.log").read_bytes()

    base = free_port_run(len(topology.SERVICES))
    with roundtrip_up(tmp_path, "--health-port", str(base), env={"ROUNDTRIP_LOG_LEVEL": "WARNING"}) as (_, _, second):
        # the moment Ready. is printed, every service answers its readiness probe
        not_ready = {}
        for name in topology.names():
            try:
                answer = httpx.get(f"http://127.0.0.1:{base + topology.index(name)}/readyz", timeout=5)
                if answer.status_code != 200:
                    not_ready[name] = f"{answer.status_code} {answer.text}"
            except httpx.HTTPError as exc:
                not_ready[name] = repr(exc)
        assert not not_ready, f"Ready. was printed before these services were ready: {not_ready}\n{second.read_text()}"
        assert second.read_text().count("Ready.") == 1
