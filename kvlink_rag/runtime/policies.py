"""The admission policies by name: one registration each (``KVLINK_RAG_ADMISSION_POLICY``)."""

from __future__ import annotations

from ..home import registered
from .admission import AdmissionPolicy, BucketPolicy, CacheAwarePolicy, FifoPolicy
from .fair_admission import FairPolicy

POLICIES = {"buckets": BucketPolicy, "cache-aware": CacheAwarePolicy, "fifo": FifoPolicy, "fair": FairPolicy}


def make_policy(name: str) -> AdmissionPolicy:
    """The policy called ``name`` (:data:`POLICIES`).

    Raises:
        ValueError: unknown name.
    """
    return POLICIES[registered("admission policy", name, POLICIES)]()
