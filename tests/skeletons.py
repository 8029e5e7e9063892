"""The files `roundtrip agent init NAME` writes, for tests that write an agent: its README runs `python` and
`roundtrip` as found on PATH (the command itself names its own interpreter and command)."""

from __future__ import annotations

from roundtrip._cli.skeleton import skeleton


def agent_files(name: str) -> dict[str, str]:
    return skeleton(name, "python", "roundtrip")
