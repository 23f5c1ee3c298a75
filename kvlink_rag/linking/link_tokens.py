"""Link-token artifacts: embeddings ``[K, hidden]`` and an optional query-side LoRA adapter, in one
safetensors file with metadata; initialisation and checks on load."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..adapter_names import ASSETS, BUNDLED  # the package's assets folder and its named adapters
from ..model.loader import LoadedModel

LORA_PREFIX = "lora."


class LinkTokensMismatch(ValueError):
    """Link tokens were made for another model (fingerprint or width differs) or are malformed."""


@dataclass
class LinkTokens:
    """K link-token embeddings shared by every document slot, optionally with a query-side LoRA adapter.

    Attributes:
        embeds: ``[K, hidden]`` float32 shared by every document slot, or ``[S, K, hidden]`` per slot
            (slot i uses row ``min(i, S - 1)``).
        model_fingerprint: fingerprint of the base model they were made for.
        metadata: provenance (training data hash, steps, validation accuracy, ...).
        lora: LoRA A/B weights (peft names) or None.
        lora_config: ``{"rank", "alpha", "targets"}`` when ``lora`` is set.
    """

    embeds: torch.Tensor
    model_fingerprint: str
    metadata: dict = field(default_factory=dict)
    lora: dict[str, torch.Tensor] | None = None
    lora_config: dict | None = None

    @property
    def k(self) -> int:
        """Link tokens per document."""
        return int(self.embeds.shape[-2])

    @property
    def slots(self) -> int:
        """1 for shared link tokens ``[K, hidden]``; S for per-slot ones ``[S, K, hidden]``."""
        return int(self.embeds.shape[0]) if self.embeds.dim() == 3 else 1

    def identity(self) -> str:
        """Short content hash, used as the adapter name so that artifacts never collide on one model.

        Hashed once per state of the tensors: every admitted request asks (its prefix-tree root), and
        hashing the shipped adapter's ~2.5 MB took ~13 ms a request; the memo is keyed by each tensor's
        identity, storage and in-place version counter, so training's in-place updates re-hash."""
        state = tuple(_state(t) for t in (self.embeds, *(self.lora[n] for n in sorted(self.lora or {}))))
        state += (tuple(sorted(self.lora or {})),)
        memo = self.__dict__.get("_identity")
        if memo is not None and memo[0] == state:
            return memo[1]
        h = hashlib.sha256(self.embeds.detach().float().cpu().numpy().tobytes())
        for name in sorted(self.lora or {}):
            h.update(name.encode())
            h.update(self.lora[name].detach().float().cpu().numpy().tobytes())
        self.__dict__["_identity"] = (state, h.hexdigest()[:12])
        return self.__dict__["_identity"][1]

    def save(self, path: Path, lora_dtype: torch.dtype = torch.bfloat16) -> None:
        """Write ``path`` (safetensors): embeddings float32, LoRA weights in ``lora_dtype``; metadata in the header."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"model_fingerprint": self.model_fingerprint, "k": str(self.k),
                "metadata": json.dumps(self.metadata, sort_keys=True),
                "lora_config": json.dumps(self.lora_config or {})}
        tensors = {"link_embeds": self.embeds.detach().float().contiguous().cpu()}
        for name, t in (self.lora or {}).items():
            tensors[LORA_PREFIX + name] = t.detach().to(lora_dtype).contiguous().cpu()
        tmp = path.with_suffix(path.suffix + ".part")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)


def _state(t: torch.Tensor) -> tuple[int, int, int]:
    """What changes when ``t``'s values can: the object, its storage and its in-place version (inference
    tensors have no version counter; they change only by being replaced)."""
    return id(t), t.data_ptr(), 0 if t.is_inference() else t._version


def initial_link_tokens(lm: LoadedModel, k: int, separator: str = "\n\n", slots: int = 1) -> LinkTokens:
    """Untrained initialisation: each link token is the embedding of a paragraph separator token
    (``[K, hidden]``, or the same copied to ``[slots, K, hidden]`` when ``slots > 1``).

    The model has seen such tokens between passages countless times, so untrained link tokens act as
    harmless separators that still attend across documents.
    """
    ids = lm.tokenizer(separator, add_special_tokens=False)["input_ids"] if lm.tokenizer is not None else [0]
    ids = ids or [0]
    idx = torch.tensor([ids[i % len(ids)] for i in range(k)], dtype=torch.long, device=lm.device)
    embeds = lm.embed_tokens(idx).detach().float().cpu()
    if slots > 1:
        embeds = embeds.expand(slots, *embeds.shape).clone()
    return LinkTokens(embeds=embeds, model_fingerprint=lm.fingerprint, metadata={"init": "separator", "trained": False})


def read_link_tokens(path: Path) -> LinkTokens:
    """Read a link-token artifact as stored, with no model at hand: embeddings float32, LoRA weights in their
    stored dtype (bfloat16 as :meth:`LinkTokens.save` writes them). :func:`load_link_tokens` checks the result
    against a model.

    Raises:
        FileNotFoundError: no such file (another OSError: unreadable). safetensors.SafetensorError: not a
            safetensors file.
        LinkTokensMismatch: the file holds no ``link_embeds`` tensor, or it is not ``[K, hidden]`` /
            ``[S, K, hidden]``.
    """
    if not Path(path).exists():
        raise FileNotFoundError(f"link-token file {path} does not exist")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        names = list(f.keys())
        if "link_embeds" not in names:
            raise LinkTokensMismatch(f"{path} holds no 'link_embeds' tensor")
        embeds = f.get_tensor("link_embeds").float()
        lora = {n[len(LORA_PREFIX):]: f.get_tensor(n) for n in names if n.startswith(LORA_PREFIX)}
    if embeds.ndim not in (2, 3):
        raise LinkTokensMismatch(f"link tokens in {path} have shape {tuple(embeds.shape)}, expected [K, hidden] "
                                 "or [slots, K, hidden]")
    return LinkTokens(embeds=embeds, model_fingerprint=meta.get("model_fingerprint", ""),
                      metadata=json.loads(meta.get("metadata", "{}")), lora=lora or None,
                      lora_config=json.loads(meta.get("lora_config", "{}")) or None)


def load_link_tokens(path: Path, lm: LoadedModel) -> LinkTokens:
    """Load and check a link-token artifact for ``lm`` (LoRA weights in ``lm.dtype``).

    Raises:
        FileNotFoundError: no such file.
        LinkTokensMismatch: made for another model, or the width is not the model's hidden size.
    """
    art = read_link_tokens(path)
    if art.model_fingerprint != lm.fingerprint:
        raise LinkTokensMismatch(f"link tokens in {path} were made for model {art.model_fingerprint[:12] or '?'}, "
                                 f"not the loaded model {lm.fingerprint[:12]}")
    if art.embeds.shape[-1] != lm.config.hidden_size:
        raise LinkTokensMismatch(f"link tokens in {path} have shape {tuple(art.embeds.shape)}, expected [K, "
                                 f"{lm.config.hidden_size}] or [slots, K, {lm.config.hidden_size}]")
    if art.lora is not None:
        art.lora = {n: t.to(lm.dtype) for n, t in art.lora.items()}
    return art


def shipped_link_tokens(lm: LoadedModel) -> LinkTokens | None:
    """The trained artifact shipped in ``kvlink_rag/assets`` for this model's fingerprint, or None.

    A shipped file made for another model (or another conversion of it) is skipped, not an error:
    the engine then uses the untrained initialisation.
    """
    for path in sorted(ASSETS.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("model_fingerprint") == lm.fingerprint:
                return load_link_tokens(path, lm)
    return None


def bundled_adapters(fingerprint: str, folder: Path = BUNDLED) -> dict[str, Path]:
    """The named adapters shipped in ``folder`` (``kvlink_rag/assets/adapters/<name>.safetensors``) that were
    made for the model with ``fingerprint``, by name. Files for other models, and unreadable ones, are
    skipped: a bundled adapter is offered only where it loads.
    """
    found = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("model_fingerprint") == fingerprint:
                    found[path.stem] = path
        except (OSError, SafetensorError):  # unreadable or not safetensors: not offered
            continue
    return found
