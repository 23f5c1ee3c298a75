"""Starting a training run from a saved artifact (``train-links --init FILE``).

The artifact's link embeddings and LoRA weights become the starting parameters (the optimiser starts
fresh: an artifact holds no moments), and the example order continues after the examples the artifact
was trained on (``examples_seen`` in its metadata, else ``steps x accumulate`` of its ``train_config``), so
the continued run does not see the same first examples again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from kvlink_rag.linking.link_tokens import LinkTokens, load_link_tokens

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine


class RunShape(Protocol):
    """The run's shape an artifact must match (``training.loop.TrainConfig``)."""

    @property
    def k(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def lora(self) -> bool: ...
    @property
    def rank(self) -> int: ...
    @property
    def targets(self) -> tuple[str, ...]: ...


class WarmStartable(Protocol):
    """What :func:`warm_start` reads and fills of a run (``training.loop.Trainer``): its shape, engine, link
    embeddings ``[slots, K, hidden]`` (or ``[K, hidden]``) and the name of its training adapter (None
    without LoRA). A protocol, so that this helper of the loop does not import the loop."""

    @property
    def cfg(self) -> RunShape: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def link_embeds(self) -> torch.nn.Parameter: ...
    @property
    def adapter(self) -> str | None: ...


def _shape(lt: LinkTokens) -> dict:
    cfg = lt.lora_config or {}
    return {"K": lt.k, "slots": lt.slots, "adapter": "query-lora" if lt.lora else "none",
            "rank": int(cfg["rank"]) if lt.lora else None,
            "targets": ",".join(cfg.get("targets", [])) if lt.lora else None}


def _wanted(trainer: WarmStartable) -> dict:
    c = trainer.cfg
    return {"K": c.k, "slots": c.slots, "adapter": "query-lora" if c.lora else "none",
            "rank": c.rank if c.lora else None, "targets": ",".join(c.targets) if c.lora else None}


def examples_seen(lt: LinkTokens) -> tuple[int, int]:
    """``(steps, examples)`` the artifact was trained for, from its metadata (0, 0 if it records none)."""
    meta = lt.metadata or {}
    steps = int(meta.get("steps", 0))
    if "examples_seen" in meta:
        return steps, int(meta["examples_seen"])
    return steps, steps * int((meta.get("train_config") or {}).get("accumulate", 1))


def warm_start(trainer: WarmStartable, path: Path) -> tuple[int, int]:
    """Copy the artifact at ``path`` into the trainer's link embeddings and training adapter.

    Returns:
        ``(steps, examples)`` the artifact had been trained for (the new run's example order starts after
        ``examples``).
    The run may add LoRA targets to the artifact's (``--targets q_proj,...,down_proj`` from a q/k/v/o
    artifact): the added projections keep their initialisation (LoRA B = 0), so the run starts from exactly
    the artifact's function and learns the new targets from there.

    Raises:
        FileNotFoundError: no such file.
        ValueError (LinkTokensMismatch included): another model, or another K, slot count, adapter or rank than
            the run asks for, or a target the run lacks (one line naming both).
    """
    lt = load_link_tokens(path, trainer.engine.lm)
    have, want = _shape(lt), _wanted(trainer)
    if have["targets"] and want["targets"] and set(have["targets"].split(",")) <= set(want["targets"].split(",")):
        have = {**have, "targets": want["targets"]}  # a subset: the added targets start at B = 0
    if have != want:
        diff = ", ".join(f"{k} {have[k]} (run: {want[k]})" for k in have if have[k] != want[k])
        raise ValueError(f"--init {path} does not fit this run: {diff}; pass the same --k/--slots/--rank/--targets")
    with torch.no_grad():
        trainer.link_embeds.copy_(lt.embeds.to(trainer.link_embeds.device))
    if lt.lora:
        from peft import set_peft_model_state_dict

        name = trainer.adapter  # the training adapter's name
        result = set_peft_model_state_dict(trainer.lm.model, lt.lora, adapter_name=name)
        held = set((lt.lora_config or {}).get("targets", []))  # targets the artifact trained
        missing = [k for k in result.missing_keys if f".{name}." in k and ".lora_" in k
                   and any(f".{t}." in k for t in held)]
        if missing or result.unexpected_keys:
            raise ValueError(f"--init {path}: adapter weights do not fit the model (missing {missing[:2]}, "
                             f"unexpected {list(result.unexpected_keys)[:2]})")
    return examples_seen(lt)
