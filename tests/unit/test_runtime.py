"""A service settles its heap once started: start-up objects frozen, a larger young generation."""

from __future__ import annotations

import json
import subprocess
import sys


def test_settle_heap_freezes_what_start_up_left_and_raises_the_young_threshold():
    # in a fresh interpreter: freezing the test process's own heap would outlive this test
    code = (
        "import gc, json\n"
        "import roundtrip._kernel.kafka.messaging\n"  # a service's imports: tens of thousands of objects
        "from roundtrip._kernel.runtime import settle_heap, YOUNG_GENERATION_THRESHOLD\n"
        "frozen = settle_heap()\n"
        "print(json.dumps([frozen, gc.get_freeze_count(), gc.get_threshold()[0], YOUNG_GENERATION_THRESHOLD]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    frozen, count, threshold, wanted = json.loads(out)
    assert frozen == count > 10_000
    assert threshold == wanted == 10_000


def test_a_service_runs_on_uvloop_where_it_is_installed():
    code = (
        "import asyncio, uvloop\n"
        "from roundtrip._kernel.runtime import run_loop\n"
        "async def main():\n"
        "    return type(asyncio.get_running_loop()).__module__\n"
        "print(run_loop(main()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("uvloop"), out
