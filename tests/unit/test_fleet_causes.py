"""Why a part of the fleet exited, in one line, from its own log (services/_fleet/causes.py): what `roundtrip up`
stops with when a part keeps failing at start. The logs are real ones: the console's, run with its port held by
another process (tests/unit/logs/console-port-taken.log, paths shortened), and `roundtrip run`'s refusals."""

from __future__ import annotations

from pathlib import Path

from roundtrip._fleet.causes import MAX_CHARS, Cause, of_log, of_run

LOGS = Path(__file__).parent / "logs"


def test_uvicorns_bind_error_is_the_port_that_is_taken_not_the_traceback_after_it():
    log = (LOGS / "console-port-taken.log").read_text()
    assert "SystemExit: 3" in log and "Traceback" in log  # the log as the console writes it
    assert of_log(log) == Cause("port 43263 is taken", 43263)


def test_the_health_endpoints_bind_error_names_its_port():
    line = (
        "RuntimeError: cannot serve /healthz, /readyz, /metrics on 127.0.0.1:18080 (Address already in use); "
        "set ROUNDTRIP_HEALTH_PORT to a free port (0 turns the endpoint off)"
    )
    assert of_log(f"2026-12-04 19:50:06,397 INFO roundtrip.gate: FastStream app starting...\n{line}\n").port == 18080


def test_a_settings_error_is_its_one_line():
    log = (
        "2026-12-04 19:49:29,072 INFO roundtrip.console: FastStream app starting...\n"
        "error: invalid configuration: ROUNDTRIP_PARTITIONS: Input should be a valid integer, "
        "unable to parse string as an integer\n"
        "2026-12-04 19:49:29,180 ERROR asyncio: Unclosed AIOKafkaProducer\\nproducer: <aiokafka.producer.producer."
        "AIOKafkaProducer object at 0x7f8cef5ad990>\n"
    )
    assert of_log(log) == Cause(
        "invalid configuration: ROUNDTRIP_PARTITIONS: Input should be a valid integer, unable to parse string as an "
        "integer",
        refused=True,
    )


def test_a_traceback_ending_in_system_exit_gives_the_exception_before_it():
    log = """2026-12-04 19:50:03,976 INFO roundtrip.model: FastStream app starting...
Traceback (most recent call last):
  File "/srv/roundtrip/services/_model/app.py", line 40, in build
    client = make_client(settings)
             ^^^^^^^^^^^^^^^^^^^^^
  File "/srv/roundtrip/services/_model/providers.py", line 88, in make_client
    raise ValueError("ROUNDTRIP_MODEL_REGION is not a region of this platform: 'mars-1'")
ValueError: ROUNDTRIP_MODEL_REGION is not a region of this platform: 'mars-1'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/roundtrip/services/_cli/main.py", line 762, in main
    app()
  File "/srv/roundtrip/services/_cli/main.py", line 114, in run
    raise SystemExit(1)
SystemExit: 1
"""
    assert of_log(log) == Cause("ValueError: ROUNDTRIP_MODEL_REGION is not a region of this platform: 'mars-1'")


def test_a_bare_system_exit_falls_back_to_the_last_error_logged_then_the_last_line():
    assert of_log('ERROR x: the jars are missing\nTraceback (most recent call last):\n  File "a"\nSystemExit: 2\n') == (
        Cause("x: the jars are missing")
    )
    assert of_log("starting\nKilled\n") == Cause("Killed")
    assert of_log("") == Cause("its log says nothing")


def test_a_cause_is_one_line_of_bounded_length():
    cause = of_log("error: " + "very long\n".replace("\n", " ") * 100)
    assert "\n" not in cause.text and len(cause.text) == MAX_CHARS


def test_only_this_runs_output_counts(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address in use\n"
    )
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("error: ROUNDTRIP_CONSOLE_SESSION_KEY is too short\n")
    assert of_run(log, start) == Cause("ROUNDTRIP_CONSOLE_SESSION_KEY is too short", refused=True)
    assert of_run(log, 0).port == 8000
