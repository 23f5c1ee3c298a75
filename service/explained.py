"""Retention and explain for a query: the checks of the request's fields, and the attribution of an
explained answer.

``explain`` collects, inside the batching scheduler's steps, the attention the question and answer tokens pay
to each KV slot (the model runner's probabilities for those rows, :mod:`kvlink_rag.explain.attention_rows`) and
returns each document's share and top passages (:mod:`kvlink_rag.explain.answers`); with the ``attribution`` method
``leave_one_out`` (the default, ``KVLINK_RAG_ATTRIBUTION``) the shares are leave-one-document-out's
(:mod:`kvlink_rag.explain.leave_one_out`), computed after decoding under the model lock.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

from kvlink_rag.omp_pool import release_thread_pool
from service.errors import ServiceError

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine


def check_explained(mode: str, retention: float | None, explain: bool, attribution: str | None = None) -> None:
    """Raise for a retention outside (0, 1], explain with mode ``full``, or an ``attribution`` method that is
    unknown or given without explain.

    Raises:
        ServiceError: 422 ``retention_out_of_range`` / ``explain_unsupported`` / ``invalid_attribution``.
    """
    from kvlink_rag.settings import ATTRIBUTION_METHODS as METHODS

    if attribution is not None and (attribution not in METHODS or not explain):
        raise ServiceError(422, "invalid_attribution", f"attribution must be one of {', '.join(METHODS)} and "
                           f"comes with explain: true; got {attribution!r}" + ("" if explain else " without explain"))
    from kvlink_rag.retention import check_retention

    if retention is not None:
        try:
            check_retention(retention)
        except ValueError as e:
            raise ServiceError(422, "retention_out_of_range", str(e)) from None
    if mode == "full" and (explain or retention not in (None, 1.0)):
        raise ServiceError(422, "explain_unsupported", "explain and retention apply to linked answers only "
                           "(mode 'linked'), not to the full-prefill comparison")


def explanation(eng: Engine, plan, attention: tuple | None, answer_ids: list[int] | None = None,
                lock=None) -> dict | None:
    """The plan's attribution as JSON (:func:`kvlink_rag.explain.answers.attribution_json`) from a scheduled request's
    ``(AttentionMass, LinkedContext)`` (:attr:`kvlink_rag.runtime.gen_request.GenResult.attention`), or None without explain.

    With ``plan.attribution`` ``leave_one_out`` and the answer's ``answer_ids``, the document shares are
    leave-one-document-out's (:func:`kvlink_rag.explain.leave_one_out.leave_one_out`: one more link forward per
    document, after decoding, under ``lock``, the model lock, when given); otherwise the attention's. The body
    names its ``method``.
    """
    if attention is None:
        return None
    from kvlink_rag.explain.answers import attribution, attribution_json

    mass, ctx = attention
    docs = [d.document for d in plan.docs]
    body = {**attribution_json(attribution(eng, mass, ctx, docs)), "method": "attention"}
    if plan.attribution != "leave_one_out" or answer_ids is None:
        return body
    from kvlink_rag.explain.leave_one_out import leave_one_out, with_leave_one_out

    with lock if lock is not None else nullcontext():
        try:
            drops = leave_one_out(eng, plan.question, docs, answer_ids, plan.k, plan.retention)
        finally:
            release_thread_pool()  # this request's thread hands the model back (kvlink_rag.omp_pool)
    return with_leave_one_out(body, drops)
