"""The app factory: ``create_app(settings)``; the lifespan opens the store and loads the engine.

Run with ``kvlink-rag serve`` or ``uvicorn --factory api.main:create_app``. OpenAPI is served at
``/openapi.json`` and ``/docs``.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from api import contract, errors
from api.cancellation import CancelOnDisconnect
from api.metrics import Metrics, RequestTimer
from api.routes import adapters, completions, documents, health, openai, playground, query, tokens
from api.state import ServiceState
from service.settings import Settings, get_settings


def create_app(settings: Settings | None = None, engine=None) -> FastAPI:
    """A new app (own state and metrics registry).

    Args:
        settings: defaults to the environment's (``KVLINK_RAG_*``).
        engine: an already loaded ``kvlink_rag.engine.Engine`` to serve (tests); else loaded at startup.
    """
    settings = settings if settings is not None else get_settings()
    state = ServiceState(settings, engine)
    metrics = Metrics(state)
    state.on_result = metrics.observe_query
    state.on_step = metrics.observe_step

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await anyio.to_thread.run_sync(state.open)  # model load must not block the event loop
        app.state.service = state
        try:
            yield
        finally:
            app.state.service = None
            await anyio.to_thread.run_sync(state.close)

    app = FastAPI(title="kvlink-rag", version="0.1.0", lifespan=lifespan,
                  description="Document KV-cache RAG service (KVLink): documents are encoded once, their caches "
                              "re-linked at query time.")
    app.state.metrics = metrics
    app.state.service = None
    errors.install(app)
    contract.install(app, settings)  # /openapi.json as this configuration answers
    app.add_middleware(CancelOnDisconnect)  # a client that leaves cancels its query (service.cancellation)
    app.add_middleware(RequestTimer, metrics=metrics)
    for module in (documents, query, adapters, openai, completions, tokens, health):
        app.include_router(module.router)
    if settings.playground:  # the web page at / (KVLINK_RAG_PLAYGROUND)
        app.include_router(playground.router)
    return app
