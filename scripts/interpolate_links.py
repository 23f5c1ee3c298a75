"""Interpolate two link-token artifacts in weight space (WiSE-FT, :mod:`training.wise_ft`) and write the result.

    .venv/bin/python scripts/interpolate_links.py BASE.safetensors TUNED.safetensors --weight 0.5 --out OUT.safetensors

No model is loaded: the two files must name the same model fingerprint, K and LoRA adapter. A one-line error and
exit 2 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    from kvlink_rag.linking.link_tokens import LinkTokensMismatch, read_link_tokens
    from training.wise_ft import interpolate_link_tokens

    ap = argparse.ArgumentParser(description="(1 - w) * BASE + w * TUNED for link embeddings and LoRA tensors.")
    ap.add_argument("base", type=Path, help="the artifact at weight 0 (e.g. the shipped one)")
    ap.add_argument("tuned", type=Path, help="the artifact at weight 1 (e.g. a continuation of BASE)")
    ap.add_argument("--weight", type=float, required=True, help="the share of TUNED, in [0, 1]")
    ap.add_argument("--part", action="append", default=[], metavar="SUBSTRING=W", help="another weight for the "
                    "tensors whose name holds SUBSTRING (first match wins; e.g. mlp=0.5, self_attn=1, link_embeds=1)")
    ap.add_argument("--out", type=Path, required=True, help="the .safetensors file to write")
    args = ap.parse_args(argv)
    from safetensors import SafetensorError

    try:
        parts = {k: float(w) for k, _, w in (p.partition("=") for p in args.part)}
        if "" in parts:
            raise ValueError
    except ValueError:
        ap.exit(2, f"interpolate_links: --part {args.part}: expected SUBSTRING=W, a non-empty SUBSTRING, W a number\n")
    try:
        art = interpolate_link_tokens(read_link_tokens(args.base), read_link_tokens(args.tuned), args.weight, parts)
        art.save(args.out)
    except SafetensorError as e:
        ap.exit(2, f"interpolate_links: an input is not a safetensors file ({e})\n")
    except (OSError, ValueError) as e:  # LinkTokensMismatch is a ValueError
        ap.exit(2, f"interpolate_links: {e}\n")
    print(f"wrote {args.out} (weight {args.weight} of {args.tuned.name}, identity {art.identity()})")


if __name__ == "__main__":
    main()
