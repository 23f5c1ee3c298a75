"""Link-token embeddings ``[K, hidden]``: initialisation, safetensors files with metadata, checks on load."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .model import LoadedModel


class LinkTokensMismatch(ValueError):
    """Link tokens were made for another model (fingerprint or width differs) or are malformed."""


@dataclass
class LinkTokens:
    """K link-token embeddings shared by every document slot.

    Attributes:
        embeds: ``[K, hidden]`` float32.
        model_fingerprint: fingerprint of the model they were made for.
        metadata: free-form provenance (training data hash, steps, validation accuracy, ...).
    """

    embeds: torch.Tensor
    model_fingerprint: str
    metadata: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.embeds.shape[0])

    def save(self, path: Path) -> None:
        """Write ``path`` (safetensors) with fingerprint, K and metadata in its header."""
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"model_fingerprint": self.model_fingerprint, "k": str(self.k),
                "metadata": json.dumps(self.metadata, sort_keys=True)}
        save_file({"link_embeds": self.embeds.detach().float().contiguous().cpu()}, str(path), metadata=meta)


def initial_link_tokens(lm: LoadedModel, k: int, separator: str = "\n\n") -> LinkTokens:
    """Untrained initialisation: each link token is the embedding of a paragraph separator token.

    The model has seen such tokens between passages countless times, so untrained link tokens act as
    harmless separators that still attend across documents.
    """
    ids = lm.tokenizer(separator, add_special_tokens=False)["input_ids"] or [0]
    idx = torch.tensor([ids[i % len(ids)] for i in range(k)], dtype=torch.long, device=lm.device)
    embeds = lm.embed_tokens(idx).detach().float().cpu()
    return LinkTokens(embeds=embeds, model_fingerprint=lm.fingerprint, metadata={"init": "separator", "trained": False})


def load_link_tokens(path: Path, lm: LoadedModel) -> LinkTokens:
    """Load and check link tokens for ``lm``.

    Raises:
        FileNotFoundError: no such file.
        LinkTokensMismatch: made for another model, or the width is not the model's hidden size.
    """
    if not Path(path).exists():
        raise FileNotFoundError(f"link-token file {path} does not exist")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if "link_embeds" not in f.keys():
            raise LinkTokensMismatch(f"{path} holds no 'link_embeds' tensor")
        embeds = f.get_tensor("link_embeds").float()
    fp = meta.get("model_fingerprint", "")
    if fp != lm.fingerprint:
        raise LinkTokensMismatch(
            f"link tokens in {path} were made for model {fp[:12] or '?'}, not the loaded model {lm.fingerprint[:12]}"
        )
    if embeds.ndim != 2 or embeds.shape[1] != lm.config.hidden_size:
        raise LinkTokensMismatch(f"link tokens in {path} have shape {tuple(embeds.shape)}, expected [K, "
                                 f"{lm.config.hidden_size}]")
    return LinkTokens(embeds=embeds, model_fingerprint=fp, metadata=json.loads(meta.get("metadata", "{}")))
