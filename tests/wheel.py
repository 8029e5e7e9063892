"""The project's wheel, built as the Dockerfile builds it: from a copy of the files the build reads (SOURCES, the
image's build context: .dockerignore) with pip and the venv's setuptools, no build isolation (offline, seconds).

A copy, not the checkout: a build in the checkout writes build/ and *.egg-info there, and a stale build/lib would
put files into the wheel that the sources no longer have."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "services", "schemas")  # what the wheel is built from
CACHES = ("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")


def is_cache(path: Path) -> bool:
    return (
        any(part == "__pycache__" or part.endswith(".egg-info") or part == ".pytest_cache" for part in path.parts)
        or path.suffix == ".pyc"
    )


def build_wheel(out: Path) -> Path:
    """Build the wheel into `out` and return its path; a failed build fails with pip's output."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(*CACHES))
        else:
            shutil.copy2(ROOT / name, src / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "-q",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = out.glob("*.whl")
    return wheel


def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [name for name in archive.namelist() if not name.endswith("/")]


def runtime_files() -> dict[str, Path]:
    """Where each file of services/ and schemas/ lands in the wheel (roundtrip/..., roundtrip/schemas/...)."""
    files = {}
    for folder, package in (("services", "roundtrip"), ("schemas", "roundtrip/schemas")):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and not is_cache(path.relative_to(ROOT)):
                files[f"{package}/{path.relative_to(ROOT / folder).as_posix()}"] = path
    return files


def pip_wheel(source: Path, out: Path) -> Path:
    """The wheel of the project at `source` (another one than this checkout: an agent package), built as above."""
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "-q",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = out.glob("*.whl")
    return wheel


def stub_wheel(out: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel of nothing but its metadata (a distribution's name, version and requirements): what a local index
    needs to resolve a requirement on it, offline."""
    import base64
    import hashlib

    stem = f"{name.replace('-', '_').replace('.', '_')}-{version}"
    files = {
        f"{stem}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        + f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{stem}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests.wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{stem}.dist-info/RECORD"] = "\n".join([*record, f"{stem}.dist-info/RECORD,,"]) + "\n"
    wheel = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel
