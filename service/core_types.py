"""The core's types the front ends name, re-exported so that ``api/`` reaches the core only through the
service: a generated token's log-probabilities and its bytes (:mod:`kvlink_rag.decoding.logprobs`) and, for type
checkers only, the :class:`~kvlink_rag.engine.Engine` a service state is handed (importing it would load the model
code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlink_rag.decoding.logprobs import TokenLogprob, token_bytes

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine  # noqa: F401  (a name for annotations: ``from service.core_types import Engine``)

__all__ = ["TokenLogprob", "token_bytes"]
