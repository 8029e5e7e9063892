"""What every concern of the settings is made of: the `Concern` base (ROUNDTRIP_<FIELD>, values never repeated in an
error), the marks that hide a secret, and the validated types several concerns share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    SecretStr,
)
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, SettingsConfigDict

from roundtrip._kernel.settings.checks import (
    check_database_url,
    existing_file,
)

KEYS: JsonDict = {"secret": "keys"}  # key_id:secret pairs: the ids may be shown, the secrets never
SECRET: JsonDict = {"secret": "value"}
SECRET_URL: JsonDict = {"secret": "url"}  # a URL that may carry a password: shown without it


def _database_url(value: SecretStr | None) -> SecretStr | None:
    url = value.get_secret_value().strip() if value is not None else ""
    return SecretStr(check_database_url(url)) if url else None


DatabaseUrl = Annotated[SecretStr | None, AfterValidator(_database_url)]
_upper = BeforeValidator(lambda value: value.strip().upper() if isinstance(value, str) else value)
ExistingFile = Annotated[Path | None, AfterValidator(existing_file)]


class Concern(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_", extra="ignore", hide_input_in_errors=True)
    heading: ClassVar[str]
