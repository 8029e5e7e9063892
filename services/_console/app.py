"""The console service: the web page where people decide held calls, watch turns and versions, and handle dead letters.

A FastStream app like the others, with outlets and no subscription (what waits and what ended is read from the
ledger); uvicorn serves the page on the app's event loop from its start to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn
from faststream import FastStream

from roundtrip._console import letter_pages, version_page
from roundtrip._console.ledger_reader import Books
from roundtrip._console.letters import Letters, raw_sender
from roundtrip._console.web import Console, application
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import ApprovalDecided, CancelTurn
from roundtrip._kernel.wire.letters import DeadLetterHandled
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.console")


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the process's are FastStream's, which stops this server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Web:
    def __init__(self, server: _Server, settings: Settings) -> None:
        self.server, self.settings = server, settings
        self.task: asyncio.Task[None] | None = None

    async def serve(self) -> None:
        self.task = task = asyncio.create_task(self.server.serve(), name="console web")
        while not self.server.started:
            if task.done():  # it could not bind its port: say why, and stop the service
                task.result()
                raise RuntimeError(
                    f"the console could not serve on {self.settings.listen_host}:{self.settings.console_port}"
                )
            await asyncio.sleep(0.05)
        log.info("roundtrip console: http://%s:%d", self.settings.listen_host, self.settings.console_port)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task


def build(settings: Settings, agent: Agent) -> FastStream:
    shell = Shell("console", settings, log, agent.digest, agent.holds_calls())
    decisions = shell.outlet(topics.APPROVAL_DECISIONS, ApprovalDecided, "A person's decision, signed by the console")
    cancels = shell.outlet(topics.TURN_CONTROLS, CancelTurn, "A cancel a person sent from the console")
    books = Books(settings.ledger_db_url, settings.conversations_db_url)
    handled = shell.outlet(topics.DEAD_LETTERS_HANDLED, DeadLetterHandled, "A dead letter re-driven or discarded")
    dead_letters = Letters(settings, handled, raw_sender(shell.broker))
    console = Console(settings, books, decisions, cancels)
    app = shell.app
    config = uvicorn.Config(
        application(console, [*letter_pages.routes(console, dead_letters), *version_page.routes(console)]),
        host=settings.listen_host,
        port=settings.console_port,
        log_level="warning",
        lifespan="off",
        proxy_headers=False,  # who is asking is the sign-on proxy's word, checked in services/_console/auth.py
        timeout_graceful_shutdown=5,
    )
    web = _Web(_Server(config), settings)

    async def refuse_insecure() -> None:
        settings.refuse_console_local_user("console")
        settings.refuse_weak_session_key("console")

    async def stop() -> None:
        await books.close()
        await dead_letters.close()

    app.on_startup(refuse_insecure)
    shell.serves(web)
    app.on_shutdown(stop)
    return app
