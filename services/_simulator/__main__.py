"""`python -m roundtrip._simulator`: serve the Messages API simulator on 127.0.0.1:$ROUNDTRIP_SIMULATOR_PORT."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.settings import Settings, get_settings

from .overload import Overload
from .personas import NAMES
from .ratelimits import RateLimits
from .scripted import ScriptError, Scripts, load_scripts
from .server import serve


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    args = _parser(settings).parse_args(argv)
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
        limits=RateLimits(SYSTEM, rpm=args.rpm, itpm=args.itpm, otpm=args.otpm),
        overload=Overload(SYSTEM, every=args.overload_every, seconds=args.overload_seconds),
        scripts=scripts,
        batch_delay_ms=args.batch_delay_ms,
    )


def _parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m roundtrip._simulator", description=__doc__)
    parser.add_argument("--host", default=settings.listen_host)
    parser.add_argument("--port", type=int, default=settings.simulator_port)
    parser.add_argument("--persona", default=settings.simulator_persona, choices=NAMES)
    parser.add_argument("--latency-ms", type=float, default=settings.simulator_latency_ms)
    parser.add_argument(
        "--latency-jitter",
        type=float,
        default=settings.simulator_latency_jitter,
        help="spread of the latency: 0.3 = ±30 %% (uniform)",
    )
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests answered 529")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rpm", type=_positive(int), default=settings.simulator_rpm, help="requests per minute admitted"
    )
    parser.add_argument(
        "--itpm", type=_positive(int), default=settings.simulator_itpm, help="input tokens per minute admitted"
    )
    parser.add_argument(
        "--otpm", type=_positive(int), default=settings.simulator_otpm, help="output tokens per minute admitted"
    )
    parser.add_argument(
        "--overload-every",
        type=_positive(float),
        default=settings.simulator_overload_every,
        help="seconds between bursts of 529 overloaded errors",
    )
    parser.add_argument(
        "--overload-seconds",
        type=_positive(float),
        default=settings.simulator_overload_seconds,
        help="length of each burst",
    )
    parser.add_argument(
        "--batch-delay-ms",
        type=float,
        default=settings.simulator_batch_delay_ms,
        help="how long a Message Batch stays in progress",
    )
    parser.add_argument(
        "--script", default=settings.simulator_script, help="JSON file of scripts (persona script:NAME)"
    )
    return parser


def _positive(kind: type) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value: int | float = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


if __name__ == "__main__":
    main()
