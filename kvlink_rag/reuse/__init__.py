"""Reuse methods: the interface and its registry (:mod:`.methods`) and the methods beyond plain link tokens:
CacheBlend's selective recompute (:mod:`.blend`, :mod:`.blend_stage` as a scheduled request's prefill) and
document-side encoding with an adapter (:mod:`.doc_side`). Retention's kept-token selection is part of the
kernel (:mod:`kvlink_rag.retention`: the store lays records out by it)."""
