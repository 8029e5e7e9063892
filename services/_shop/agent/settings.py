"""The demo shop agent's own settings (ROUNDTRIP_* like the fleet's): where the shop is, and the approval threshold.
The fleet runs the embedded demo shop only when the agent it runs has these settings and no `shop_url`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from roundtrip._kernel.settings.base import SECRET_URL, DatabaseUrl


class ShopAgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_", extra="ignore", hide_input_in_errors=True)

    approval_cancel_above_cents: int | None = Field(
        None,
        ge=0,
        description="cancel_order waits for a person's approval when the order's total is above this (cents); unset: "
        "never",
    )
    shop_url: str | None = Field(
        None, description="Base URL of the shop API; unset means the embedded shop on shop_port"
    )
    shop_port: int = Field(8802, description="Port of the embedded demo shop")
    shop_database_url: DatabaseUrl = Field(
        None,
        json_schema_extra=SECRET_URL,
        description="SQLAlchemy URL of the shop database; unset means a SQLite file in state_dir",
    )

    @property
    def shop_base_url(self) -> str:
        return self.shop_url or f"http://127.0.0.1:{self.shop_port}"

    def shop_db_url(self, state_dir: Path) -> str:
        if self.shop_database_url is not None:
            return self.shop_database_url.get_secret_value()
        return f"sqlite+aiosqlite:///{(Path(state_dir) / 'shop.db').resolve()}"
