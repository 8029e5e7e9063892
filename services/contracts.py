"""Generates the checked-in contract: event JSON Schemas and the AsyncAPI document.

`roundtrip contracts` writes them into contracts/; a test regenerates them in memory and
fails when the checked-in files drift from the code.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from faststream.specification import AsyncAPI

from services.kernel import events, topology
from services.kernel.settings import Settings

ROOT = Path(__file__).resolve().parent.parent / "contracts"


def event_schemas() -> dict[str, dict]:
    return {model.__name__: model.model_json_schema() for model in (*events.PUBLIC, *events.INTERNAL)}


def asyncapi_document() -> dict:
    settings = Settings(_env_file=None, topic_prefix="", kafka_bootstrap_servers="localhost:9092")
    brokers = [importlib.import_module(s.app_module).build(settings).broker for s in topology.SERVICES]
    spec = AsyncAPI(
        *brokers,
        title="roundtrip",
        version="1",
        description=(
            "Topics of the roundtrip fleet. Clients publish SupportRequest to support.requests and read SupportReply "
            "from support.replies (exactly one per request); they may read SupportStatus from support.status (a turn "
            "waiting for a person, and until when: never a reply). Every other topic is internal. Messages are JSON, "
            "keyed by conversation id."
        ),
    )
    return spec.to_specification().to_jsonable()


def rendered() -> dict[str, str]:
    """Relative path -> file text, exactly as checked in."""
    files = {f"events/{name}.json": json.dumps(schema, indent=2, sort_keys=True) + "\n" for name, schema in event_schemas().items()}
    files["asyncapi.json"] = json.dumps(asyncapi_document(), indent=2, sort_keys=True) + "\n"
    return files


def write(root: Path = ROOT) -> list[Path]:
    written = []
    for rel, text in rendered().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
