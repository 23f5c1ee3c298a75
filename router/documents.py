"""A routed request's documents, resolved as a replica would: named ids through the shared index, ``top_k``
through the same BM25 retrieval (:mod:`service.retrieval`) over it, whose chosen ids are then passed on in
``document_ids`` (so the replica does not retrieve differently). Anything the router cannot resolve is left to
the replica, which answers it (or refuses it with its own 4xx): the router never validates differently."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field

from service.settings import Settings
from service.retrieval import Retrieval, above_cutoff

log = logging.getLogger(__name__)
DOCUMENT_ROUTES = ("/v1/query", "/v1/chat/completions")
ROUTED = (*DOCUMENT_ROUTES, "/v1/completions")


@dataclass
class Resolved:
    """What routing needs of one request.

    Attributes:
        docs: ``[(cache key, tokens)]`` of its documents (a chunked document: each chunk's key).
        body: the JSON to forward (``top_k`` replaced by the chosen ``document_ids``), or None: forward as sent.
        text: the request's text for the approximate prefix index.
        conversation: a key of the conversation (chat with earlier turns) for stickiness, or None.
    """

    docs: list[tuple[str, int]] = field(default_factory=list)
    body: dict | None = None
    text: str = ""
    conversation: str | None = None


def _content(message: dict) -> str:
    c = message.get("content")
    if isinstance(c, list):
        return " ".join(p.get("text", "") for p in c if isinstance(p, dict))
    return c if isinstance(c, str) else ""


def _question(path: str, body: dict) -> str:
    if path == "/v1/query":
        return body.get("question") if isinstance(body.get("question"), str) else ""
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    return _content(users[-1]) if users else ""


def conversation_key(tenant: str, body: dict) -> str | None:
    """A chat's identity across turns: its system prompt and first user message (None without one); the next
    turn repeats them, so it finds the replica whose prefix tree holds the earlier turns."""
    msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    users = [m for m in msgs if m.get("role") == "user"]
    if not users:
        return None
    system = next((_content(m) for m in msgs if m.get("role") == "system"), "")
    return hashlib.sha256(json.dumps([tenant, system, _content(users[0])]).encode()).hexdigest()


class DocumentResolver:
    """Resolves requests against the shared index (the replicas' ``KVLINK_RAG_INDEX_URL``).

    Args:
        index: a :class:`store.index.document_index.DocumentIndex` (records: cache keys, token counts).
        retrieval: BM25 over the same index and texts.
        settings: the replicas' settings (``default_top_k``, retrieval cut-offs).
    """

    def __init__(self, index, retrieval: Retrieval | None, settings: Settings):
        self.index, self.retrieval, self.settings = index, retrieval, settings

    def resolve(self, path: str, tenant: str, body: dict) -> Resolved:
        """The documents, rewritten body, prefix text and conversation of a request to ``path``; a failure
        (index down, bad fields) gives what was resolved so far, the body forwarded as sent."""
        out = Resolved(text=json.dumps([tenant, body.get("messages") or body.get("question") or body.get("prompt"),
                                        body.get("document_ids")], default=str))
        if path == "/v1/chat/completions":
            out.conversation = conversation_key(tenant, body)
        if path not in DOCUMENT_ROUTES or self.index is None:
            return out
        try:
            ids = body.get("document_ids")
            if ids is None:
                ids = self._retrieve(path, tenant, body)
                if ids:
                    out.body = {k: v for k, v in body.items() if k not in ("top_k", "min_relative_score", "min_score")}
                    out.body["document_ids"] = ids
            out.docs = self._documents(tenant, ids if isinstance(ids, list) else [])
        except Exception as e:  # noqa: BLE001 - the replica decides (and refuses bad input itself)
            log.debug("documents of a %s request not resolved: %s", path, e)
            out.body = None
        return out

    def _retrieve(self, path: str, tenant: str, body: dict) -> list[str]:
        question, top_k = _question(path, body), body.get("top_k")
        top_k = self.settings.default_top_k if top_k is None else top_k
        if self.retrieval is None or not question or not isinstance(top_k, int) or not 1 <= top_k <= self.settings.max_top_k:
            return []
        s = self.settings
        rel, floor = body.get("min_relative_score"), body.get("min_score")
        hits = above_cutoff(self.retrieval.search(tenant, question, top_k),
                            s.retrieval_min_relative_score if rel is None else float(rel),
                            s.retrieval_min_score if floor is None else float(floor))
        return [doc_id for doc_id, _ in hits]

    def _documents(self, tenant: str, ids: list) -> list[tuple[str, int]]:
        docs = []
        for doc_id in dict.fromkeys(i for i in ids if isinstance(i, str)):
            rec = self.index.get(tenant, doc_id)
            keys = [k for k in rec.cache_keys if k] if rec is not None else []
            for key in keys:
                docs.append((key, max(1, rec.num_tokens // len(keys))))
        return docs
