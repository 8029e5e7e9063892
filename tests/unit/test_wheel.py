"""The built wheel holds one package, `roundtrip`, complete (issue 28): no `services`, `tests` or `examples` in
site-packages, and every file of services/ and schemas/ (the code and every file the installed fleet reads at run
time: the broker's pom.xml and log4j2.yaml, the migrations and their template, the event and tool schemas) in it.

The files are derived from the checkout, so a new data file that pyproject.toml's package-data misses fails here.
tests/e2e/test_installed_wheel_e2e.py installs this wheel into a fresh venv and runs the fleet from it.
"""

from __future__ import annotations

import tomllib
import zipfile

import pytest

from roundtrip._kernel.wire import events
from tests.wheel import ROOT, build_wheel, runtime_files, wheel_files

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
DIST_INFO = f"{PROJECT['name'].replace('-', '_')}-{PROJECT['version']}.dist-info"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def shipped(wheel) -> set[str]:
    return set(wheel_files(wheel))


def test_the_only_top_level_package_is_roundtrip(wheel, shipped):
    assert {name.split("/")[0] for name in shipped} == {"roundtrip", DIST_INFO}
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(f"{DIST_INFO}/top_level.txt").decode().split() == ["roundtrip"]
        scripts = archive.read(f"{DIST_INFO}/entry_points.txt").decode()
    assert "roundtrip = roundtrip._cli:entry" in scripts  # the clash check, then roundtrip._cli.main


def test_every_file_of_services_and_schemas_is_in_the_wheel_as_it_is_in_the_checkout(wheel, shipped):
    wanted = runtime_files()
    missing = sorted(set(wanted) - shipped)
    assert not missing, "files the wheel lacks (pyproject.toml's [tool.setuptools.package-data]):\n  " + "\n  ".join(
        missing
    )
    with zipfile.ZipFile(wheel) as archive:
        changed = [name for name, path in wanted.items() if archive.read(name) != path.read_bytes()]
    assert not changed, f"files the wheel holds otherwise than the checkout: {changed}"
    extra = sorted(name for name in shipped - set(wanted) if not name.startswith(f"{DIST_INFO}/"))
    assert not extra, f"files in the wheel that services/ and schemas/ do not have: {extra}"


def test_the_files_the_installed_fleet_reads_at_run_time_are_among_them(shipped):
    """The derivation above cannot pass by finding nothing: the files issue 28 found missing, by name."""
    data = {name for name in runtime_files() if not name.endswith(".py")}
    assert {
        "roundtrip/_broker/log4j2.yaml",
        "roundtrip/_broker/pom.xml",
        "roundtrip/_kernel/migrations/script.py.mako",
    } <= data
    tools = sorted(name.rpartition("/")[2] for name in data if name.startswith("roundtrip/schemas/tools/"))
    assert tools == [
        f"{name}.json"
        for name in sorted(
            (
                "list_orders",
                "lookup_order",
                "cancel_order",
                "get_shipping_status",
                "search_help_center",
                "escalate_to_human",
            )
        )
    ]
    event_names = {model.__name__ for model in (*events.PUBLIC, *events.INTERNAL)}
    assert {f"roundtrip/schemas/events/{name}.json" for name in event_names} <= data
    versions = {
        f"roundtrip/_kernel/migrations/versions/{p.name}"
        for p in (ROOT / "services/_kernel/migrations/versions").glob("*_*.py")
    }
    assert versions and versions <= shipped
    assert data <= shipped
