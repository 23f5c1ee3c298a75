"""Retention and explain for a query: the checks of the request's fields, and the attribution of an
explained answer.

``explain`` collects, inside the batching scheduler's steps, the attention the question and answer tokens pay
to each KV slot (the model runner's probabilities for those rows, :mod:`kvlink_rag.attention_rows`) and
returns each document's share and top passages (:mod:`kvlink_rag.explain`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.errors import ServiceError

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine


def check_explained(mode: str, retention: float | None, explain: bool) -> None:
    """Raise for a retention outside (0, 1] or explain with mode ``full``.

    Raises:
        ServiceError: 422 ``retention_out_of_range`` / ``explain_unsupported``.
    """
    from kvlink_rag.retention import check_retention

    if retention is not None:
        try:
            check_retention(retention)
        except ValueError as e:
            raise ServiceError(422, "retention_out_of_range", str(e)) from None
    if mode == "full" and (explain or retention not in (None, 1.0)):
        raise ServiceError(422, "explain_unsupported", "explain and retention apply to linked answers only "
                           "(mode 'linked'), not to the full-prefill comparison")


def explanation(eng: Engine, plan, attention: tuple | None) -> dict | None:
    """The plan's attribution as JSON (:func:`kvlink_rag.explain.attribution_json`) from a scheduled request's
    ``(AttentionMass, LinkedContext)`` (:attr:`service.gen_request.GenResult.attention`), or None without explain."""
    if attention is None:
        return None
    from kvlink_rag.explain import attribution, attribution_json

    mass, ctx = attention
    return attribution_json(attribution(eng, mass, ctx, [d.document for d in plan.docs]))
