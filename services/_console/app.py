"""The console service: the web page (services/_console/web.py, served by uvicorn on ROUNDTRIP_CONSOLE_PORT) where
people decide held calls and watch turns, and its two outlets: turn.approval_decisions (each decision signed here with
the first decision key) and turn.control (the cancel `roundtrip turns cancel` sends); and the dead letters
(services/_console/letters.py): read from roundtrip.dead_letters, re-driven to their source topics, each re-drive or
discard recorded on roundtrip.dead_letters.handled.

It is a service like the others to `roundtrip run`: a FastStream app whose broker holds the outlets (no subscription:
what waits and what ended is read from the turn ledger), with the health endpoint of every service. The web server
runs on the app's event loop from its start to its end; the app's signal handling stays FastStream's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn
from faststream import FastStream

from roundtrip._console import letter_pages
from roundtrip._console.ledger_reader import Books
from roundtrip._console.letters import Letters, raw_sender
from roundtrip._console.web import Console, application
from roundtrip._kernel.kafka.messaging import Outlet, make_broker, service_app
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import ApprovalDecided, CancelTurn, DeadLetterHandled
from roundtrip._sdk.agent import Agent

log = logging.getLogger("roundtrip.console")


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the process's are FastStream's, which stops this server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def build(settings: Settings, agent: Agent) -> FastStream:
    broker = make_broker("console", settings)
    decisions = Outlet(broker, topics.APPROVAL_DECISIONS, ApprovalDecided, "A person's decision, signed by the console")
    cancels = Outlet(broker, topics.TURN_CONTROLS, CancelTurn, "A cancel a person sent from the console")
    books = Books(
        settings.ledger_db_url, settings.conversations_db_url
    )  # the ledger, opened read-only when first read (services/_console/ledger_reader.py)
    handled = Outlet(broker, topics.DEAD_LETTERS_HANDLED, DeadLetterHandled, "A dead letter re-driven or discarded")
    dead_letters = Letters(settings, handled, raw_sender(broker))  # read from Kafka when a page first asks
    console = Console(settings, books, decisions, cancels)
    app = service_app(broker, log)
    config = uvicorn.Config(
        application(console, letter_pages.routes(console, dead_letters)),
        host=settings.listen_host,
        port=settings.console_port,
        log_level="warning",
        lifespan="off",
        proxy_headers=False,  # who is asking is the sign-on proxy's word, checked in services/_console/auth.py
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)
    running: list[asyncio.Task[None]] = []

    async def refuse_insecure() -> None:
        settings.refuse_unfit_keys("console", topology.service("console").keys, agent.holds_calls())
        settings.refuse_console_local_user("console")
        settings.refuse_weak_session_key("console")

    async def serve() -> None:
        running.append(asyncio.create_task(server.serve(), name="console web"))
        while not server.started:
            if running[0].done():  # it could not bind its port: say why, and stop the service
                running[0].result()
                raise RuntimeError(f"the console could not serve on {settings.listen_host}:{settings.console_port}")
            await asyncio.sleep(0.05)
        log.info("roundtrip console: http://%s:%d", settings.listen_host, settings.console_port)

    async def stop() -> None:
        server.should_exit = True
        if running:
            with contextlib.suppress(Exception):
                await running[0]
        await books.close()
        await dead_letters.close()

    app.on_startup(refuse_insecure)
    app.after_startup(serve)
    app.on_shutdown(stop)
    return app
