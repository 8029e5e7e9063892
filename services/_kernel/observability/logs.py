"""The services' log lines: one record, one line, whatever the values in it hold.

Ids from outside may hold any character, and a newline in one would start a line that reads like a line of its own
(a forged `roundtrip.security` line). Lines that name such ids write them with `%r`; `OneLineFormatter` is the net
under every other line (a traceback that follows the message keeps its lines, and only those: the exception's text in
it is escaped too).
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# C0 controls but tab, DEL, C1 controls (NEL among them) and the Unicode line and paragraph separators
_BREAKING = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with every character that could end or rewrite a log line spelled out (`\\n`, `\\x1b`, `\\u2028`)."""
    return _BREAKING.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _exceptions(te: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """`te` and every exception chained to it (cause, context, the members of a group)."""
    yield te
    for linked in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        if linked is not None:
            yield from _exceptions(linked)


class OneLineFormatter(logging.Formatter):
    """A formatter whose message part is always one line, and whose tracebacks keep only their own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        """The traceback as logging writes it, but an exception's text (its message and notes, which may come from
        outside: a tool's error, a record's field) on one escaped line: it cannot start a line of its own."""
        if ei[1] is None:
            return super().formatException(ei)
        te = traceback.TracebackException(ei[0], ei[1], ei[2], compact=True)
        said = {chunk for each in _exceptions(te) for chunk in each.format_exception_only()}
        out: list[str] = []
        text: list[str] = []  # the chunks of one exception's text, written as one line
        for chunk in [*te.format(chain=True), ""]:
            if chunk in said:
                text.append(chunk)
                continue
            if text:
                out.append(one_line("".join(text).removesuffix("\n")) + "\n")
                text = []
            out.append("\n".join(one_line(line) for line in chunk.split("\n")))  # its structure kept, escaped within
        return "".join(out).removesuffix("\n")


def configure(level: str | int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
