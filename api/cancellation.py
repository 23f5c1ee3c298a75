"""ASGI middleware: a request whose client disconnects is cancelled (:mod:`service.cancellation`).

Each HTTP request gets a :class:`~service.cancellation.CancelScope`, bound in its context (so the worker
threads ``anyio.to_thread`` starts for it see the same scope). Once the app has read the whole request body,
a watcher waits for ``http.disconnect``; when it comes before the response is complete the scope is
cancelled: a query waiting for the scheduler leaves its queue at once, one being admitted stops loading
documents, one generating leaves the batch before the next step, and their threads and model slots are
released. A disconnect is still handed to the app when it asks (``sse_starlette`` listens for it too).
"""

from __future__ import annotations

import asyncio

from service.cancellation import CancelScope, bind, unbind


class CancelOnDisconnect:
    """Wraps an ASGI app (see the module docstring)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cancel, body_read, gone = CancelScope(), asyncio.Event(), asyncio.Event()
        done = [False]

        async def app_receive():
            if body_read.is_set():  # only the watcher reads from the server now
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read.set()
            elif message["type"] == "http.disconnect":
                gone.set()
                cancel.cancel()
            return message

        async def watch():
            await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not done[0]:
                cancel.cancel()

        async def tracked_send(message):
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                done[0] = True
            await send(message)

        token = bind(cancel)
        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, app_receive, tracked_send)
        finally:
            watcher.cancel()
            unbind(token)
