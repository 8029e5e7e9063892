"""The embedded broker's jars: Apache Kafka fetched once from Maven Central with `mvn` (the pom.xml beside this module)
into a cache folder, and the errors of setting the broker up."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from roundtrip._kernel.settings import EmbeddedDefaults

DEFAULT_VERSION: str = EmbeddedDefaults.model_fields["kafka_version"].default
_HERE = Path(__file__).resolve().parent
DEFAULT_POM = _HERE / "pom.xml"
_MARKER = ".fetched"  # written last into the cache folder: the fetch is complete


class BrokerError(RuntimeError):
    """The embedded broker could not be set up, started or reached."""


class BrokerSetupError(BrokerError):
    """A prerequisite (java, mvn, the jars) is missing."""


class PortInUseError(BrokerError):
    """A port the broker needs is already taken (checked before launching)."""


class BrokerStartError(BrokerError):
    """The broker exited early or did not become ready in time."""


def kafka_cache_dir(version: str = DEFAULT_VERSION, cache: Path | None = None) -> Path:
    """Folder of the fetched Kafka jars: `cache` (ROUNDTRIP_KAFKA_CACHE) or ~/.cache/roundtrip/kafka-<version>."""
    if cache:
        return Path(cache).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "roundtrip" / f"kafka-{version}"


def is_fetched(version: str, cache: Path | None) -> bool:
    folder = kafka_cache_dir(version, cache)
    return (folder / _MARKER).is_file() and any((folder / "libs").glob("kafka_2.13-*.jar"))


def find_java() -> str:
    """Path of `java` (JAVA_HOME first); a clear error saying what to install when missing."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise BrokerSetupError(
            "`java` not found: the embedded Kafka broker needs Java 17 or newer. Install it "
            "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`; macOS: `brew install openjdk@17`) "
            "or set JAVA_HOME. Alternatively point ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS at an existing Kafka."
        )
    return java


def find_mvn(cache: Path | None) -> str:
    mvn = shutil.which("mvn")
    if not mvn:
        cache = cache or kafka_cache_dir()
        raise BrokerSetupError(
            "`mvn` not found: Maven fetches the Apache Kafka jars from Maven Central (once). Install it "
            "(Debian/Ubuntu: `apt-get install maven`; macOS: `brew install maven`), or put the jars of "
            "org.apache.kafka:kafka_2.13 and its dependencies into "
            f"{cache / 'libs'} yourself and create {cache / _MARKER}."
        )
    return mvn


def fetch_kafka(
    version: str,
    progress: Callable[[str], object] | None = print,
    *,
    pom: Path | None = None,
    cache: Path | None,
) -> Path:
    """Fetch the Kafka jars with mvn into the cache (once) and return the libs folder. The download goes into a
    temporary folder renamed into place when complete, so an interrupted fetch never leaves a half-filled cache;
    concurrent callers are serialised with a lock file."""
    given_cache, cache = cache, kafka_cache_dir(version, cache)
    if is_fetched(version, given_cache):
        return cache / "libs"
    say = progress or (lambda _msg: None)
    pom = Path(pom or DEFAULT_POM)
    if not pom.is_file():
        raise BrokerSetupError(f"Kafka fetch pom not found at {pom} (set ROUNDTRIP_KAFKA_POM)")
    mvn = find_mvn(cache)
    find_java()  # mvn needs it too, and the error message is better
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fetched(version, given_cache):  # another process fetched while we waited
            return cache / "libs"
        tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
        try:
            say(f"Fetching Apache Kafka {version} jars from Maven Central with mvn into {cache} (about 55 MB, once)...")
            started = time.monotonic()
            cmd = [
                mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom),
                f"-Dkafka.version={version}",
                "dependency:copy-dependencies", f"-DoutputDirectory={tmp / 'libs'}",
            ]  # fmt: skip
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
            jars = list((tmp / "libs").glob("kafka_2.13-*.jar"))
            if proc.returncode != 0 or not jars:
                output = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
                raise BrokerSetupError(
                    f"fetching Kafka {version} with mvn failed (exit {proc.returncode}); is Maven Central "
                    f"reachable? command: {shlex.join(cmd)}\n" + "\n".join(output)
                )
            (tmp / _MARKER).write_text(f"kafka {version}\n")
            if cache.exists():  # a stale, incomplete cache: replace it
                shutil.rmtree(cache)
            os.rename(tmp, cache)
            size = sum(p.stat().st_size for p in (cache / "libs").iterdir()) / 1e6
            say(
                f"Fetched {len(list((cache / 'libs').iterdir()))} jars ({size:.0f} MB) in "
                f"{time.monotonic() - started:.1f}s"
            )
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return cache / "libs"


def fetch_configured(settings: EmbeddedDefaults, progress: Callable[[str], object] | None = print) -> Path:
    """fetch_kafka for the version, pom and cache the embedded defaults name; the libs folder."""
    return fetch_kafka(settings.kafka_version, progress, pom=settings.kafka_pom, cache=settings.kafka_cache)
