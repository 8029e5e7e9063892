"""The skeleton `roundtrip agent init` writes is deployable as generated (issue 29, item 3): its wheel carries its
JSON tool documents and loads from a fresh venv, and pip resolves its dependency to this project's distribution
(roundtrip-fleet), never the unrelated PyPI project `roundtrip`.

Offline and in seconds: the wheels are built with this venv's setuptools (tests/wheel.py); the fresh venvs have no
pip of their own (this venv's pip installs into them with --python) and see the fleet's third-party dependencies
through a .pth file; the resolution runs against a local index: this project's real wheel, a wheel of the unrelated
`roundtrip` 0.1.1 (metadata only, as a squatter's would be), and metadata-only wheels of the fleet's dependencies at
the versions installed here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.skeletons import agent_files
from tests.wheel import build_wheel, pip_wheel, stub_wheel

NAME, PACKAGE = "desk-kind", "desk_kind"
LOAD = """import json, sys
from roundtrip._sdk.agent import load_agent
import desk_kind
agent = load_agent("desk-kind")
print(json.dumps({"module": desk_kind.__file__, "tools": sorted(agent.registry.specs), "path": sys.path}))"""


def write_skeleton(folder: Path, **replace: str) -> Path:
    for relative, text in agent_files(NAME).items():
        for old, new in replace.items():
            text = text.replace(old, new)
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    return folder


def fresh_venv(folder: Path, see_fleet: bool) -> Path:
    """A venv without pip; `see_fleet`: this venv's site-packages on its path (the fleet and its dependencies)."""
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], capture_output=True, timeout=60)
    assert made.returncode == 0, made.stderr
    if see_fleet:
        (site,) = (folder / "lib").glob("python3*/site-packages")
        # a site dir of its own, so its .pth files count too (the editable install's finder among them)
        (site / "fleet.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return folder


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def load_in(venv: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_") and k != "PYTHONPATH"}
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", LOAD], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a freshly generated skeleton, built as its Dockerfile's pip install builds it."""
    folder = tmp_path_factory.mktemp("skeleton")
    return pip_wheel(write_skeleton(folder / "src"), folder / "dist")


def test_the_skeletons_wheel_carries_its_schemas_and_loads_its_agent_in_a_fresh_venv(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"{PACKAGE}/schemas/get_ticket.json" in names
    # the fleet, and pytest (with pytest-asyncio, its loop scope set) for its tests only in its `test` extra
    assert re.findall(r"(?m)^Requires-Dist: (.+)$", metadata) == [
        "roundtrip-fleet",
        'pytest; extra == "test"',
        'pytest-asyncio; extra == "test"',
    ]
    assert "Provides-Extra: test" in metadata
    venv = fresh_venv(tmp_path / "venv", see_fleet=True)
    installed = pip(venv, "install", "--no-deps", "--no-index", "-q", str(wheel))
    assert installed.returncode == 0, installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    loaded = load_in(venv, elsewhere)
    assert loaded.returncode == 0, loaded.stderr
    seen = json.loads(loaded.stdout)
    assert Path(seen["module"]).is_relative_to(venv) and "site-packages" in seen["module"]  # from the wheel
    assert seen["tools"] == ["close_ticket", "get_ticket"]  # get_ticket: the JSON document, read from the wheel


def test_without_its_package_data_the_wheel_would_drop_the_schemas_and_the_agent_would_not_load(tmp_path):
    source = write_skeleton(tmp_path / "src", **{'[tool.setuptools.package-data]\ndesk_kind = ["schemas/*.json"]': ""})
    wheel = pip_wheel(source, tmp_path / "dist")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".json")]
    venv = fresh_venv(tmp_path / "venv", see_fleet=True)
    assert pip(venv, "install", "--no-deps", "--no-index", "-q", str(wheel)).returncode == 0
    loaded = load_in(venv, tmp_path)
    assert loaded.returncode == 1 and "is not a folder" in loaded.stderr  # what the user met


def test_pip_resolves_a_fresh_skeleton_to_this_project_never_the_unrelated_roundtrip(wheel, tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    fleet = build_wheel(tmp_path / "fleet")
    (index / fleet.name).write_bytes(fleet.read_bytes())
    stub_wheel(index, "roundtrip", "0.1.1", ("google-cloud-translate",))  # the unrelated project, as PyPI has it
    for line in distribution("roundtrip-fleet").requires or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            stub_wheel(index, requirement.name, distribution(requirement.name).version)
    venv = fresh_venv(tmp_path / "venv", see_fleet=False)  # clean: nothing installed
    report = tmp_path / "report.json"
    resolved = pip(
        venv,
        "install",
        "--dry-run",
        "--no-index",
        "--find-links",
        str(index),
        "--report",
        str(report),
        "-q",
        str(wheel),
    )
    assert resolved.returncode == 0, resolved.stderr
    chosen = {i["metadata"]["name"]: i["download_info"]["url"] for i in json.loads(report.read_text())["install"]}
    assert chosen["roundtrip-fleet"] == (index / fleet.name).as_uri()  # this project's wheel
    assert "roundtrip" not in chosen and "google-cloud-translate" not in chosen, sorted(chosen)


@pytest.fixture(autouse=True)
def _no_user_site(monkeypatch):
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
