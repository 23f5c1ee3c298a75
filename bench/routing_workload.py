"""The routing benchmarks' workload: queries of distinct documents drawn Zipf(1.0), and the documents' lengths in
tokens (real NQ passages, counted with the default model's tokenizer when its ``tokenizer.json`` is at hand).

Shared by the process bench (:mod:`bench.routing`) and the model-free simulation (:mod:`bench.routing_sim`).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

WORDS_TO_TOKENS = 1.59
"""Tokens per whitespace word of an NQ passage with its title and prompt framing (SmolLM2's tokenizer: 123.1
tokens for 77.5 words on average over the first 1,000 gold passages); used only without a tokenizer file."""


def zipf_weights(n_docs: int, s: float = 1.0) -> list[float]:
    """Unnormalised Zipf(``s``) weights of documents ranked 0..n_docs-1: ``1 / (rank + 1) ** s``."""
    return [1.0 / (i + 1) ** s for i in range(n_docs)]


def zipf_queries(n_docs: int, n: int, per_query: int, seed: int = 0) -> list[list[int]]:
    """``n`` queries of ``per_query`` distinct document indices, each drawn Zipf(1.0) over ``n_docs`` (a repeat
    is drawn again: successive sampling without replacement). Same seed, same queries."""
    rng = random.Random(seed)
    population = range(n_docs)
    cum = list(itertools.accumulate(zipf_weights(n_docs)))  # what random.choices builds from weights, once
    out = []
    for _ in range(n):
        picked: list[int] = []
        while len(picked) < per_query:
            d = rng.choices(population, cum_weights=cum)[0]
            if d not in picked:
                picked.append(d)
        out.append(picked)
    return out


def document_text(text: str, title: str | None) -> str:
    """A passage as the prompt frames it (:meth:`kvlink_rag.text.prompt.PromptTemplate.document_text`, without
    its whitespace normalisation, so counts may differ by a token or two)."""
    return f"Document (Title: {title}) {text}\n\n" if title and title.strip() else f"Document: {text}\n\n"


def passage_tokens(examples, tokenizer_file: Path | None) -> tuple[list[int], str]:
    """``(tokens per gold passage of ``examples`` (NQ examples), how they were counted)``: with the tokenizer in
    ``tokenizer_file`` (a Hugging Face ``tokenizer.json``) when it exists, else words x :data:`WORDS_TO_TOKENS`."""
    texts = [document_text(e.gold.text, e.gold.title) for e in examples]
    if tokenizer_file is not None and Path(tokenizer_file).exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_file))
        counts = [len(enc.ids) for enc in tok.encode_batch(texts, add_special_tokens=False)]
        return counts, f"tokenizer {Path(tokenizer_file).parent.name}"
    return [max(1, round(len(t.split()) * WORDS_TO_TOKENS)) for t in texts], "words x 1.59 (no tokenizer file)"
