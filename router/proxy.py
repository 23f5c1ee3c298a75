"""The router's ASGI app: every request is forwarded to one live replica, chosen by the policy for
``/v1/query``, ``/v1/chat/completions`` and ``/v1/completions`` (:mod:`router.scoring`), any live one otherwise.

* Bodies and responses pass through unchanged (a stream chunk by chunk, as the replica sends it), except that
  a ``top_k`` query's body names the retrieved ``document_ids`` (:mod:`router.documents`); bad input is the
  replica's to refuse, with its own 4xx.
* A request that fails before its first byte (connection refused or reset, or a 503 from a full replica) is
  retried once on the next replica of the ranking; a refused connection also marks the replica down a while.
* A client that disconnects closes the upstream connection, so the replica cancels the request.
* ``x-kvlink-replica`` in every response names the replica (its URL) that answered.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import time
from collections import OrderedDict
from contextlib import asynccontextmanager

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from router import scoring
from router.documents import ROUTED, DocumentResolver, Resolved
from router.fleet import Fleet, ReplicaState
from router.prefix_index import PrefixIndex
from router.settings import RouterSettings

log = logging.getLogger(__name__)
HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
       "proxy-connection", "accept-encoding"}
REPLICA_HEADER = "x-kvlink-replica"


def _error(status: int, code: str, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "service_unavailable" if status == 503 else "server_error"
    return JSONResponse({"error": {"code": code, "message": message, "type": kind}}, status_code=status)


class Router:
    """Chooses and forwards (one per app).

    Args:
        settings: the router's; api_keys: the replicas' ``KVLINK_RAG_API_KEYS`` (key -> tenant) for resolving
            a request's tenant; fleet, resolver: the fleet picture and the document resolver.
    """

    def __init__(self, settings: RouterSettings, fleet: Fleet, resolver: DocumentResolver | None,
                 api_keys: dict[str, str] | None = None):
        self.settings, self.fleet, self.resolver, self.api_keys = settings, fleet, resolver, api_keys or {}
        self.weights = scoring.Weights(shared_tier=settings.shared_tier, request_tokens=settings.request_tokens,
                                       uncached_weight=settings.uncached_weight, balance_slack=settings.balance_slack,
                                       load_floor=settings.load_floor)
        self.prefixes = PrefixIndex()
        self.document_rank = scoring.document_aware  # (docs, views, weights) -> ranked views; a bench may swap it
        self.sticky: OrderedDict[str, str] = OrderedDict()  # conversation -> replica URL
        self.turn = itertools.count()
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(settings.timeout_s, connect=2.0))
        self.routed: dict[str, int] = {}
        fleet.on_drop = self.prefixes.forget

    def tenant(self, request: Request) -> str:
        """The tenant of the request's bearer key (``default`` without keys; ``""`` for an unknown key: the
        replica refuses it)."""
        if not self.api_keys:
            return "default"
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else ""
        found = ""
        for candidate, tenant in self.api_keys.items():
            if hmac.compare_digest(candidate.encode(), key.encode()):
                found = tenant
        return found

    def rank(self, resolved: Resolved | None) -> list[ReplicaState]:
        """Live replicas in the order to try them, by the policy (any order for unrouted paths)."""
        live = self.fleet.live()
        by_url = {r.url: r for r in live}
        views = [r.view() for r in live]
        policy, w = self.settings.policy, self.weights
        if resolved is None or policy == "round-robin":
            ranked = scoring.round_robin(views, next(self.turn))
        elif policy == "least-load":
            ranked = scoring.least_load(views, w)
        elif policy == "prefix-only":
            ranked = scoring.prefix_only(self.prefixes.match(resolved.text), len(resolved.text), views, w)
        else:
            ranked = self.document_rank(resolved.docs, views, w)
        if resolved is not None and resolved.conversation is not None:
            ranked = scoring.sticky_first(ranked, self.sticky.get(resolved.conversation),
                                          self.settings.overload_inflight)
        return [by_url[v.id] for v in ranked]

    def remember(self, resolved: Resolved | None, url: str) -> None:
        if resolved is None:
            return
        self.prefixes.insert(url, resolved.text)
        if resolved.conversation is not None:
            self.sticky[resolved.conversation] = url
            self.sticky.move_to_end(resolved.conversation)
            while len(self.sticky) > 100_000:
                self.sticky.popitem(last=False)

    async def resolve(self, request: Request, raw: bytes) -> tuple[Resolved | None, bytes]:
        """The request's routing facts and the body to forward (None: not a routed request)."""
        if request.method != "POST" or request.url.path not in ROUTED:
            return None, raw
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return Resolved(), raw  # the replica refuses it
        if not isinstance(body, dict):
            return Resolved(), raw
        if self.resolver is None:
            return Resolved(text=raw.decode("utf-8", "replace")), raw
        resolved = await anyio.to_thread.run_sync(self.resolver.resolve, request.url.path, self.tenant(request), body)
        return resolved, (json.dumps(resolved.body).encode() if resolved.body is not None else raw)

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        resolved, body = await self.resolve(request, raw)
        ranked = self.rank(resolved)
        if not ranked:
            return _error(503, "no_replica", "no live replica to forward to (none registered or listed, or all "
                          "stopped heartbeating); retry shortly")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        for attempt, rep in enumerate(ranked[:2]):
            last = attempt == min(len(ranked), 2) - 1
            rep.in_flight += 1
            try:
                req = self.client.build_request(request.method, rep.url + url, headers=headers, content=body)
                upstream = await self._send_unless_left(request, req)
            except httpx.TransportError as e:
                rep.in_flight -= 1
                self.fleet.mark_down(rep.url)
                log.warning("replica %s failed before its first byte (%s)%s", rep.url, e, "" if last else "; retrying")
                if last:
                    return _error(502, "replica_failed", f"the replica failed before answering: {e}")
                continue
            if upstream is None:  # the client left before the replica answered: its request was closed there
                rep.in_flight -= 1
                return Response(status_code=499)
            if upstream.status_code == 503 and not last:
                rep.in_flight -= 1
                await upstream.aclose()
                continue
            self.remember(resolved, rep.url)
            self.routed[rep.url] = self.routed.get(rep.url, 0) + 1
            return self._response(upstream, rep)
        return _error(502, "replica_failed", "no replica answered")  # not reached: the last attempt returns

    async def _send_unless_left(self, request: Request, req: httpx.Request) -> httpx.Response | None:
        """The replica's response (headers; the body streams later), or None when the client disconnected
        first: the upstream request is then cancelled, which closes its connection, so the replica cancels it.

        Raises:
            httpx.TransportError: the replica failed before its first byte.
        """
        got: list = []

        async def send(scope: anyio.CancelScope) -> None:
            try:
                got.append(await self.client.send(req, stream=True))
            except httpx.TransportError as e:
                got.append(e)
            scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, tg.cancel_scope)
            tg.start_soon(watch, tg.cancel_scope)
        if got and isinstance(got[0], Exception):
            raise got[0]
        return got[0] if got else None

    def _response(self, upstream: httpx.Response, rep: ReplicaState) -> StreamingResponse:
        async def chunks():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:  # also when the client left: closing the upstream connection cancels the request there
                rep.in_flight -= 1
                rep.last_done = time.time()
                await upstream.aclose()

        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}  # raw bytes: encoding kept
        headers[REPLICA_HEADER] = rep.id
        return StreamingResponse(chunks(), status_code=upstream.status_code, headers=headers)

    async def close(self) -> None:
        await self.client.aclose()
        self.fleet.close()


def create_router_app(router: Router) -> Starlette:
    """The ASGI app of ``router``: ``/router/status`` (the fleet as the router sees it), everything else proxied."""

    async def status(request: Request) -> JSONResponse:
        with router.fleet.lock:
            reps = [{"url": r.url, "id": r.id, "synced": r.synced, "seq": r.seq, "documents": len(r.held),
                     "in_flight": r.in_flight, "load": {k: r.load.get(k, 0) for k in
                                                        ("running", "waiting", "queued_prefill_tokens")},
                     "resyncs": r.resyncs, "routed": router.routed.get(r.url, 0)}
                    for r in router.fleet.live()]
        return JSONResponse({"policy": router.settings.policy, "replicas": reps})

    @asynccontextmanager
    async def lifespan(app):
        router.fleet.start()
        try:
            yield
        finally:
            await router.close()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/router/status", status),
                             Route("/{path:path}", router.handle, methods=methods)], lifespan=lifespan)
