"""Time to first token: full prefill vs linked caches (host tier, LMDB warm, LMDB cold) vs the physical floor.

Linked TTFT is broken into cache load (lookup + waiting on LMDB reads not hidden by the prefetch),
RoPE re-application (with the KV copies into the cache), and the one forward pass that computes the
link tokens and the question together. The first decode step is timed separately. The floor is a plain
memory copy of the same KV bytes plus the forward of only the link and question tokens over a ready cache.
"""

from __future__ import annotations

import statistics
import time

import torch

from kvlink_rag.decoding.generate import SamplingParams, decode, full_prefill
from kvlink_rag.engine import Engine
from kvlink_rag.linking.kvcache import build_cache
from kvlink_rag.linking.linker import _positions, plan_layout, rotate_documents, slot_link_embeds
from kvlink_rag.linking.mask import additive, allowed
from kvlink_rag.types import Document, LayeredDocuments

from .bandwidth import copy_floor
from .timing import Timing, measure


def drop_page_cache() -> bool:
    """Ask the kernel to drop clean page-cache pages (needs root); True if it worked."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


@torch.inference_mode()
def ttft_full(engine: Engine, question: str, docs: list[Document], repeats: int) -> Timing:
    """Tokenise, prefill the whole prompt, pick the first token."""
    def run():
        ctx = full_prefill(engine.lm, engine.prompt_ids(question, docs))
        return int(torch.argmax(ctx.last_logits))
    return measure(run, repeats)


def _linked(engine: Engine, question: str, docs: list[Document], before=None):
    stages = {"load_s": [], "rope_s": [], "link_forward_s": []}

    def run():
        if before is not None:
            before()
        t0 = time.perf_counter()
        ctx, hits = engine.link_context(question, docs)
        int(torch.argmax(ctx.last_logits))
        t = ctx.timings
        for k_, v in (("load_s", t.load_s), ("rope_s", t.rope_s), ("link_forward_s", t.link_forward_s)):
            stages[k_].append(v)
        assert hits == len(docs), "documents must be cached before timing"
        return time.perf_counter() - t0
    return run, stages


def ttft_linked(engine: Engine, question: str, docs: list[Document], repeats: int, before=None) -> dict:
    """Linked TTFT with its stage breakdown (medians). ``before`` runs untimed before each repeat: each repeat is
    timed from the link's start to its first token (``before`` waits for the previous repeat's memory-tier fill and
    drops tiers or the page cache; timed with it, as until session 2026-12-05e, the LMDB rows carried that wait)."""
    run, stages = _linked(engine, question, docs, before)
    times = [run() for _ in range(repeats)]
    total = Timing(statistics.median(times), min(times), max(times), repeats)
    med = {k: sorted(v)[len(v) // 2] for k, v in stages.items()}
    return {"total": total.as_dict(), **med}


@torch.inference_mode()
def first_decode_step(engine: Engine, question: str, docs: list[Document], repeats: int) -> Timing:
    """One decode step after linking (the cost of the second token)."""
    def run():
        ctx, _ = engine.link_context(question, docs)
        gen = decode(engine.lm, ctx, SamplingParams(max_new_tokens=2))
        next(gen)
        t0 = time.perf_counter()
        next(gen, None)
        return time.perf_counter() - t0
    times = sorted(run() for _ in range(repeats))
    return Timing(times[len(times) // 2], times[0], times[-1], repeats)


@torch.inference_mode()
def physical_floor(engine: Engine, question: str, docs: list[Document], repeats: int) -> dict:
    """memcpy of the documents' KV bytes (:func:`bench.bandwidth.copy_floor`) + forward of link and question
    tokens over a ready cache."""
    lm = engine.lm
    kvs = [engine.get_or_encode(d)[0] for d in docs]
    tensors = [t for kv in kvs for t in (kv.keys, kv.values)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    copy = copy_floor(tensors, repeats)  # into touched buffers, one thread: no allocation or page faults
    q_ids = engine.template.question_ids(lm.tokenizer, question)
    k = engine.link_tokens.k if engine.link_tokens is not None else 0
    segments = plan_layout(engine.prefix.num_tokens, [kv.num_tokens for kv in kvs], k, len(q_ids))
    doc_k, doc_v = rotate_documents(lm, LayeredDocuments.from_documents(kvs), segments, engine.prefix)
    cached = torch.cat([torch.arange(engine.prefix.num_tokens), _positions(segments, ("document",))])
    new = torch.cat([_positions(segments, ("link",)), _positions(segments, ("question",))])
    mask = additive(allowed(segments, engine.anchored, new, torch.cat([cached, new])), lm.dtype).to(lm.device)
    parts = slot_link_embeds(engine.link_tokens.embeds.to(lm.device, lm.dtype), len(kvs)) if k else []
    embeds = torch.cat(parts + [lm.embed_tokens(q_ids.to(lm.device))])[None]
    new = new.to(lm.device)
    caches = [build_cache(doc_k, doc_v) for _ in range(repeats + 1)]

    def fwd():
        lm.model(inputs_embeds=embeds, position_ids=new[None], attention_mask=mask, cache=caches.pop(),
                 use_cache=True, logits_to_keep=1)
    forward = measure(fwd, repeats)
    return {"kv_bytes": nbytes, "copy": copy.as_dict(), "forward": forward.as_dict(),
            "floor_s": copy.median + forward.median}

