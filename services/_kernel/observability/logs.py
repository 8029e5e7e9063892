"""The services' log lines: one record, one line, whatever the values in it hold.

Ids from outside may hold any character, and a newline in one would start a line that reads like a line of its own
(a forged `roundtrip.security` line). Lines that name such ids write them with `%r`; `OneLineFormatter` is the net
under every other line (a traceback that follows the message keeps its lines).
"""

from __future__ import annotations

import logging
import re

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# C0 controls but tab, DEL, C1 controls (NEL among them) and the Unicode line and paragraph separators
_BREAKING = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with every character that could end or rewrite a log line spelled out (`\\n`, `\\x1b`, `\\u2028`)."""
    return _BREAKING.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class OneLineFormatter(logging.Formatter):
    """A formatter whose message part is always one line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)


def configure(level: str | int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
