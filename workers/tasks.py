"""The precompute task (imported by workers only; the API enqueues it by name).

``kvlink.precompute(tenant, doc_id, version)`` encodes the document's current text and writes its KV
cache and index entry through :meth:`service.documents.DocumentService.precompute_or_fail` (whose policy
marks permanent failures ``failed``):

* idempotent: a version that is no longer current is skipped (``status: skipped``), and a cache that is
  already in the store is not encoded again;
* late acknowledgement: the broker message is acknowledged only after the task returned, so a worker
  killed mid-task (even SIGKILL) leaves the message to be redelivered to another worker after the
  broker's visibility timeout; the blob store writes a cache in one LMDB transaction, so there is never
  a half-written cache;
* retries: unexpected errors (Redis or store trouble) are retried with exponential backoff up to
  ``task_max_retries``; then, and at once for permanent errors (text too long for the model), the
  document is marked ``failed`` with the reason.
"""

from __future__ import annotations

import logging

from celery import shared_task

from service.settings import get_settings
from workers.celery_app import PRECOMPUTE_TASK
from workers.runtime import get_runtime

log = logging.getLogger(__name__)


@shared_task(name=PRECOMPUTE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
             max_retries=get_settings().task_max_retries)
def precompute(self, tenant: str, doc_id: str, version: int) -> dict:
    """Precompute one document version.

    Returns:
        ``{"status": "ready" | "skipped" | "failed", "tenant", "doc_id", "version", "num_tokens"}``.
    Raises:
        celery.exceptions.Retry: a retry was scheduled; the last error once retries are exhausted.
    """
    out = {"tenant": tenant, "doc_id": doc_id, "version": version, "num_tokens": 0}
    try:
        done = get_runtime().documents.precompute_or_fail(tenant, doc_id, version)
    except ValueError as e:  # permanent: bad settings (the document's own are handled by precompute_or_fail)
        _mark_failed(tenant, doc_id, version, str(e))
        return {**out, "status": "failed", "error": str(e)}
    except Exception as e:  # noqa: BLE001 - transient until proven otherwise
        if self.request.retries >= self.max_retries:
            _mark_failed(tenant, doc_id, version, f"gave up after {self.request.retries} retries: {e}")
            raise
        log.warning("precompute %s/%s v%d failed (%s); retrying", tenant, doc_id, version, e)
        raise self.retry(exc=e, countdown=min(2 ** self.request.retries, 60)) from e
    if done.status == "failed":  # permanent: empty or longer than the model's context
        return {**out, "status": "failed", "error": done.error}
    record = done.record
    if record is None:
        log.info("precompute %s/%s v%d skipped: deleted or superseded", tenant, doc_id, version)
        return {**out, "status": "skipped"}
    log.info("precomputed %s/%s v%d: %d tokens", tenant, doc_id, version, record.num_tokens)
    return {**out, "status": "ready", "num_tokens": record.num_tokens}


def _mark_failed(tenant: str, doc_id: str, version: int, reason: str) -> None:
    """Mark the document failed, best effort (the runtime itself may be what cannot be built)."""
    try:
        get_runtime().documents.mark_failed(tenant, doc_id, version, reason)
    except Exception:  # noqa: BLE001 - the index may be the thing that is down
        log.exception("could not mark %s/%s v%d failed", tenant, doc_id, version)
