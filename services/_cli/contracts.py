"""Generates the checked-in contract: the event JSON Schemas (schemas/events/), the AsyncAPI document
(contracts/asyncapi.json) and the manual's configuration reference. The checked-in files are what this writes from
the code, never edited by hand.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from faststream.specification import AsyncAPI

from roundtrip._kernel.settings import Settings
from roundtrip._kernel.settings.display import reference
from roundtrip._kernel.wire import events, topology
from roundtrip._sdk.agent import load_agent

ROOT = Path(__file__).resolve().parents[2]


class NotACheckout(RuntimeError):
    """`roundtrip contracts` runs from an installed package: there is no checkout to write into."""


def checkout() -> Path:
    """The checkout this package runs from (services/ beside pyproject.toml, schemas/ and contracts/), else
    NotACheckout: an installed package lies in site-packages, where nothing generated may be written."""
    package = Path(__file__).resolve().parents[1]
    if package.name == "services" and all(
        (ROOT / name).exists() for name in ("pyproject.toml", "schemas", "contracts")
    ):
        return ROOT
    raise NotACheckout(
        "`roundtrip contracts` writes schemas/events/, contracts/ and docs/reference/ of a checkout of the "
        "repository, and "
        f"this roundtrip is installed at {package}, not in one: run it from a checkout (pip install -e .)"
    )


def event_schemas() -> dict[str, dict[str, Any]]:
    return {model.__name__: model.model_json_schema() for model in (*events.PUBLIC, *events.INTERNAL)}


def asyncapi_document() -> dict[str, Any]:
    settings = Settings(_env_file=None, topic_prefix="", kafka_bootstrap_servers="localhost:9092")
    agent = load_agent()  # the topics are the fleet's, whichever agent it runs: the demo agent's build declares them
    brokers = [importlib.import_module(s.app_module).build(settings, agent).broker for s in topology.SERVICES]
    spec = AsyncAPI(
        *brokers,
        title="roundtrip",
        version="1",
        description=(
            "Topics of the roundtrip fleet. Clients publish SupportRequest to support.requests and read SupportReply "
            "from support.replies (exactly one per request); they may read SupportStatus from support.status (each "
            "step as it starts, with what the customer may read of it; a turn waiting for a person, and until when: "
            "never a reply) and StreamedText from support.stream (the text of a turn that streams, as the model "
            "writes it: never the reply either). A SupportRequest with lane `batch` has its model calls made through "
            "Message Batches: half the price, its one reply within minutes to hours (lane absent: the fleet's "
            "ROUNDTRIP_DEFAULT_LANE); a fleet that does not know the field ignores it and answers interactively. "
            "Every other topic is internal. Messages are JSON, keyed by conversation id."
        ),
    )
    return _refer_to_schema_files(spec.to_specification().to_jsonable())


def _refer_to_schema_files(document: dict[str, Any]) -> dict[str, Any]:
    """Each message's payload refers to its event's file in schemas/events/; the schemas those files hold
    (the events and their $defs) leave the document's components, so each is written once."""
    events_by_name = event_schemas()
    held = set(events_by_name) | {name for schema in events_by_name.values() for name in schema.get("$defs", {})}
    for message in document["components"]["messages"].values():
        name = message["payload"].get("$ref", "").rpartition("/")[2]
        if name in events_by_name:
            message["payload"] = {"$ref": f"../schemas/events/{name}.json"}
    schemas = document["components"].get("schemas", {})
    for name in [n for n in schemas if n in held]:
        del schemas[name]
    if not schemas:
        document["components"].pop("schemas", None)
    return document


def rendered() -> dict[str, str]:
    """Relative path -> file text, exactly as checked in."""
    files = {
        f"schemas/events/{name}.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in event_schemas().items()
    }
    files["docs/reference/configuration.md"] = reference()
    files["contracts/asyncapi.json"] = json.dumps(asyncapi_document(), indent=2, sort_keys=True) + "\n"
    return files


def write(root: Path | None = None) -> list[Path]:
    """Write the generated files under `root`, by default the checkout (NotACheckout from an installed package)."""
    root, written = checkout() if root is None else root, []
    for rel, text in rendered().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
