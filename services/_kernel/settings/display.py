"""What `roundtrip config` prints: the effective settings under a heading per concern, no secret among them.

Secrets are the fields marked `secret` or typed `SecretStr` (a signing key's id is shown, its key not) and any
password or token a URL carries (`postgresql+asyncpg://roundtrip:***@db/ledger`).
"""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from roundtrip._kernel.settings.base import Concern
from roundtrip._kernel.settings.checks import env_name
from roundtrip._kernel.settings.concerns import CONCERNS

if TYPE_CHECKING:
    from roundtrip._kernel.settings import Settings

HIDDEN = "***"
_AUTHORITY = re.compile(r"://([^/?#\s]*)")  # scheme://[user[:password]@]host[:port]
_QUERY_SECRET = re.compile(r"([?&](?:password|passwd|pwd|secret|token|api_key|key)=)[^&#]*", re.IGNORECASE)


def masked(field: FieldInfo, value: Any) -> str:
    if value is None:
        return "(unset)"
    if value == "":
        return '""'
    secret = field.json_schema_extra.get("secret") if isinstance(field.json_schema_extra, dict) else None
    if isinstance(value, SecretStr):
        if secret not in ("keys", "url"):
            return HIDDEN  # a secret no marker says how to show: not at all
        value = value.get_secret_value()
    if secret == "url":
        return without_passwords(str(value))
    if secret:
        if secret == "keys":
            return ",".join(
                f"{key_id.strip()}:{HIDDEN}" if colon else HIDDEN  # an entry without an id is all secret
                for key_id, colon, _ in (part.partition(":") for part in str(value).split(","))
            )
        return HIDDEN
    return without_passwords(str(value))


def without_passwords(text: str) -> str:
    """`text` with the password (or token) of any URL in it hidden: safe to print or log."""
    return _QUERY_SECRET.sub(rf"\1{HIDDEN}", _AUTHORITY.sub(_hide_userinfo, text))


def _hide_userinfo(match: re.Match[str]) -> str:
    userinfo, at, host = match.group(1).rpartition("@")  # the last @ ends the user info (a password may hold one)
    if not at or ":" not in userinfo:
        return match.group(0)
    return f"://{userinfo.partition(':')[0]}:{HIDDEN}@{host}"


def grouped(settings: Concern) -> list[tuple[str, list[tuple[str, str]]]]:
    groups = []
    for concern in CONCERNS:
        if isinstance(settings, concern):
            rows = [
                (env_name(name), masked(field, getattr(settings, name))) for name, field in concern.model_fields.items()
            ]
            groups.append((concern.heading, rows))
    return groups


def own_group(heading: str, own: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    fields = getattr(type(own), "model_fields", None)
    if not fields:
        return []
    prefix = str(getattr(own, "model_config", {}).get("env_prefix", ""))
    return [
        (heading, [(f"{prefix}{name}".upper(), masked(field, getattr(own, name))) for name, field in fields.items()])
    ]


def render(settings: Concern, extra: list[tuple[str, list[tuple[str, str]]]]) -> str:
    groups = grouped(settings) + extra
    width = max(len(variable) for _, rows in groups for variable, _ in rows)
    return "\n\n".join(
        "\n".join([f"# {heading}", *(f"{variable:<{width}}  {value}" for variable, value in rows)])
        for heading, rows in groups
    )


def warnings(settings: Settings, approvals: bool) -> list[str]:
    """What a person should fix before this configuration leaves a laptop (the published development keys in use)."""
    found = []
    if settings.dev_batch_key_in_use:
        where = (
            "development only" if settings.development else "the gate, the executor and the guard will REFUSE TO START"
        )
        found.append(
            "ROUNDTRIP_BATCH_SIGNING_KEY / ROUNDTRIP_BATCH_VERIFY_KEYS hold the published development pair: anyone "
            f"can sign batches with it ({where}). Make a pair of your own with `roundtrip keys`."
        )
    if approvals and settings.dev_decision_key_in_use:
        where = (
            "development only" if settings.development else "the console, the gate and the guard will REFUSE TO START"
        )
        found.append(
            "approvals are on and ROUNDTRIP_DECISION_SIGNING_KEY / ROUNDTRIP_DECISION_VERIFY_KEYS hold the published "
            f"development pair: anyone can approve a call with it ({where}). Make a pair of your own with "
            "`roundtrip keys`."
        )
    return found


REFERENCE_INTRO = """# Configuration reference

Generated from the settings classes (`roundtrip contracts` writes this page: edit the settings, not the page).
Environment variables (pydantic-settings, prefix `ROUNDTRIP_`), one group per concern; `roundtrip config` prints
the effective values under the same headings, with every secret hidden (the API key, the Kafka passwords, the
console's session key, the private signing keys (their ids are shown), any password in a URL). Secrets are read as
`SecretStr`, and a refused setting is named without repeating any value the environment gave.
"""


def reference() -> str:
    parts = [REFERENCE_INTRO.rstrip("\n")]
    for concern in CONCERNS:
        parts.append(f"\n## {concern.heading}\n")
        if "__doc__" in vars(concern) and concern.__doc__:
            parts.append(inspect.cleandoc(concern.__doc__) + "\n")
        parts.append("| variable | default | meaning |\n| --- | --- | --- |")
        parts += [
            f"| `{env_name(name)}` | {_shown_default(field)} | {field.description or ''} |"
            for name, field in concern.model_fields.items()
        ]
    return "\n".join(parts) + "\n"


def _shown_default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, SecretStr):
        return "the published development key"
    if value is None:
        return "(unset)"
    if value == "":
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"
