"""``train-links`` options of issue 28: the task mixture, the speed switches, link-token initialisation and the
device (parsed here, checked before the model loads; a bad value is a one-line error)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import fail

MixtureOpt = Annotated[Optional[str], typer.Option(
    help="Train on a task mixture: task=weight pairs among nq (5-20 documents, gold anywhere), kv (key-value "
    "retrieval, generated from seeds apart from eval's), long (passages joined into one document, chunked as the "
    "store chunks it), retention (documents kept at retention < 1), polarity (a subject's two documents saying "
    "opposite things, the question asking for one side), e.g. nq=1,kv=0.5,long=0.5,retention=0.5,polarity=0.5; "
    "validation per task, each task's best step saved as <out>-best-<task>. Default: NQ at --docs only.")]
MixNqDocsOpt = Annotated[str, typer.Option(help="MIN-MAX documents of a mixture's nq example (drawn uniformly).")]
MixKvDocsOpt = Annotated[int, typer.Option(help="Documents of a mixture's kv example (2 pairs each).")]
MixPoolOpt = Annotated[int, typer.Option(help="kv and long examples cycle through this many questions (their documents "
                                         "encoded once, --preencode covers them); 0: a new one every example.")]
MixKvAnswerOpt = Annotated[str, typer.Option(
    help="A mixture's kv target: value (the bare UUID) or sentence ('The corresponding value is ...', so kv "
         "training does not teach terse answers). Like every --mix-* option, an error without --mixture.")]
MixLongOpt = Annotated[str, typer.Option(help="MIN-MAX passages joined into a mixture's long document.")]
MixRetentionsOpt = Annotated[str, typer.Option(help="Retentions a mixture's retention example is drawn from "
                                               "(comma-separated, each in (0, 1]).")]
PackOpt = Annotated[bool, typer.Option("--pack/--no-pack", help="The --accumulate examples of a step in one forward "
                                       "without padding, on the training runner (plain torch, fused projections, "
                                       "attention with its own backward; same loss and gradients).")]
FastAttentionOpt = Annotated[bool, typer.Option("--fast-attention/--no-fast-attention", help="Training attention that "
                                                "forms no gradient for the cached document KV (same result).")]
Bf16Opt = Annotated[bool, typer.Option("--bf16/--no-bf16", help="The frozen base model's GEMMs in bfloat16 during "
                                       "training steps (CPUs with AMX / AVX512-BF16, or a GPU); all else float32.")]
PreencodeOpt = Annotated[bool, typer.Option("--preencode/--no-preencode", help="Encode every document the run will "
                                            "use once before the first step (else each is encoded in the step that "
                                            "first needs it).")]
LinkInitOpt = Annotated[str, typer.Option(help="Link-token initialisation: separator (the paragraph separator's "
                                          "embedding) or document (training passages' last hidden states + noise).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda or cuda:N (default: the device setting).")]
CheckpointOpt = Annotated[Optional[Path], typer.Option(help="Checkpoint folder (params, optimiser state, curves; "
                                                       "resumed when present). Default <out>.ckpt.")]


@dataclass(frozen=True)
class MixDefaults:
    """The ``--mix-*`` options' defaults (one place: ``train-links`` declares them, :func:`parse_mixture` tells a
    set option from them)."""

    nq_docs: str = "5-20"
    kv_docs: int = 10
    pool: int = 0
    long_passages: str = "5-15"
    retentions: str = "0.4,0.6,0.8"
    kv_answer: str = "value"


MIX = MixDefaults()


def _span(name: str, text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    if not (lo.strip().isdigit() and hi.strip().isdigit()) or not 1 <= int(lo) <= int(hi):
        fail(f"{name} {text!r}: expected MIN-MAX with 1 <= MIN <= MAX, e.g. 5-20")
    return int(lo), int(hi)


def parse_mixture(mixture: str | None, nq_docs: str, kv_docs: int, pool: int, long_passages: str,
                  retentions: str, docs: int, kv_answer: str = MIX.kv_answer):
    """The :class:`training.mixture.Mixture` of the options (None without ``--mixture``); or exit, also when a
    ``--mix-*`` option is set without ``--mixture`` (it would do nothing)."""
    if mixture is None:
        given = {"--mix-nq-docs": nq_docs != MIX.nq_docs, "--mix-kv-docs": kv_docs != MIX.kv_docs,
                 "--mix-pool": pool != MIX.pool, "--mix-long-passages": long_passages != MIX.long_passages,
                 "--mix-retentions": retentions != MIX.retentions, "--mix-kv-answer": kv_answer != MIX.kv_answer}
        if names := [name for name, set_ in given.items() if set_]:
            fail(f"{', '.join(names)} set without --mixture: the mix options shape a task mixture only")
        return None
    from training.mixture import KV_ANSWERS, Mixture, parse_weights

    try:
        weights = parse_weights(mixture)
        rs = tuple(float(x) for x in retentions.split(",") if x.strip())
    except ValueError as e:
        fail(str(e) if "mixture" in str(e) else f"--mix-retentions {retentions!r}: comma-separated numbers in (0, 1]")
    if kv_docs < 1 or pool < 0:
        fail("--mix-kv-docs must be >= 1 and --mix-pool >= 0")
    if kv_answer not in KV_ANSWERS:
        fail(f"--mix-kv-answer {kv_answer!r}: choose {' or '.join(KV_ANSWERS)}")
    try:
        return Mixture(weights, _span("--mix-nq-docs", nq_docs), kv_docs, _span("--mix-long-passages", long_passages),
                       rs, docs, pool, kv_answer).check()
    except ValueError as e:
        fail(f"--mixture: {e}")


def check_speed(bf16: bool, device: str | None, doc_side: bool, link_init: str) -> None:
    """``--bf16`` only where bfloat16 is native (or on a GPU), no speed switch with ``--doc-side``, a known
    ``--link-init``; or exit."""
    if link_init not in ("separator", "document"):
        fail(f"--link-init {link_init!r}: choose separator or document")
    if bf16 and doc_side:  # what the arguments say first, what this machine can do after
        fail("--bf16 and --doc-side do not combine (the document encodings keep their graph in float32)")
    if bf16 and not (device or "").startswith("cuda"):
        from kvlink_rag.model.loader import cpu_has_native_bf16

        if not cpu_has_native_bf16():
            fail("--bf16: this CPU has no native bfloat16 (AMX / AVX512-BF16); bfloat16 GEMMs would be emulated "
                 "and slower than float32")


def issue28_options(mix, pack: bool, fast_attention: bool, bf16: bool, link_init: str, device: str | None,
                    doc_side: bool) -> tuple[dict, dict]:
    """``(TrainConfig fields, settings overrides)`` of the issue-28 options, checked (:func:`check_speed`); or
    exit. No importance scores (scoring, eager attention per layer, made each step ~3x slower: 17 steps in 100 s
    on an H200) unless the mixture's retention task keeps tokens by importance."""
    check_speed(bf16, device, doc_side, link_init)
    if mix is not None and doc_side:
        fail("--mixture and --doc-side do not combine")
    cfg = {"mixture": mix, "pack": pack, "fast_attention": fast_attention, "bf16": bf16, "link_init": link_init}
    settings = {"importance_scores": mix is not None and "retention" in mix.tasks, **({"device": device} if device else {})}
    return cfg, settings
