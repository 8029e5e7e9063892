"""`python -m services.simulator`: serve the Messages API simulator on 127.0.0.1:$ROUNDTRIP_SIMULATOR_PORT."""

from __future__ import annotations

import argparse
import sys

from services.kernel.settings import get_settings

from .personas import NAMES
from .scripted import ScriptError, Scripts, load_scripts
from .server import serve


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m services.simulator", description=__doc__)
    parser.add_argument("--host", default=settings.listen_host)
    parser.add_argument("--port", type=int, default=settings.simulator_port)
    parser.add_argument("--persona", default=settings.simulator_persona, choices=NAMES)
    parser.add_argument("--latency-ms", type=float, default=settings.simulator_latency_ms)
    parser.add_argument("--latency-jitter", type=float, default=settings.simulator_latency_jitter,
                        help="spread of the latency: 0.3 = ±30 %% (uniform)")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests answered 529")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--script", default=settings.simulator_script, help="JSON file of scripts (persona script:NAME)")
    args = parser.parse_args(argv)
    try:
        scripts = Scripts(load_scripts(args.script))
    except ScriptError as exc:
        sys.exit(f"error: {exc}")
    serve(
        host=args.host,
        port=args.port,
        log_level=settings.log_level,
        default_persona=args.persona,
        latency_ms=args.latency_ms,
        latency_jitter=args.latency_jitter,
        fault_rate=args.fault_rate,
        seed=args.seed,
        scripts=scripts,
    )


if __name__ == "__main__":
    main()
