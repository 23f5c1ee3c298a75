"""Pilot (throw-away): KVzip-style reconstruction scores for retention, patched into the eval.
PILOT_SCORE=h2o|rmax|rsum ; PILOT_ORDER=h2o|top"""
import os, sys, torch
import kvlink_rag.engine_documents as ed
import kvlink_rag.retention as ret
from kvlink_rag.model.attention import capture_attention
from kvlink_rag.model.lora import adapter_scope

SCORE = os.environ.get("PILOT_SCORE", "h2o")
ORDER = os.environ.get("PILOT_ORDER", "h2o")
_orig = ed.encode_document
_tok = {}

def recon_scores(lm, ids, prefix):
    if "p" not in _tok:
        text = os.environ.get("PILOT_PROMPT", "<|im_end|>\n<|im_start|>user\nRepeat the previous context exactly.<|im_end|>\n<|im_start|>assistant\n")
        _tok["p"] = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        print("repeat ids", len(_tok["p"]), file=sys.stderr)
    rp = torch.tensor(_tok["p"], dtype=torch.long)
    pre = prefix.token_ids if prefix is not None else torch.zeros(0, dtype=torch.long)
    P, n, m = pre.numel(), ids.numel(), rp.numel()
    full = torch.cat([pre, ids.cpu(), rp, ids.cpu()])
    layers = []
    def cb(layer, w):
        # w: [1, heads, q, k]; rows of the repeat (prompt + copy), keys of the document
        s = w[0, :, P + n:, P:P + n].float().amax(dim=1)  # [heads, n]
        layers.append(s.amax(dim=0))
    with torch.no_grad(), adapter_scope(lm, None), capture_attention(lm, cb):
        lm.decoder(input_ids=full[None].to(lm.device), position_ids=torch.arange(full.numel())[None], use_cache=False)
    L = torch.stack(layers)  # [layers, n]
    return L.amax(0) if SCORE == "rmax" else L.sum(0)

def patched(lm, ids, **kw):
    kv = _orig(lm, ids, **kw)
    if SCORE != "h2o" and kw.get("importance") and kw.get("context") is None:
        import dataclasses; kv = dataclasses.replace(kv, importance=recon_scores(lm, ids, kw.get("prefix")).contiguous())
    return kv

def top_order(importance, n, sinks=ret.SINK_TOKENS):
    if importance is None:
        return torch.arange(n)
    s = min(sinks, n)
    heavy = torch.sort(-importance[s:].float(), stable=True).indices + s
    return torch.cat([torch.arange(s), heavy])

ed.encode_document = patched
if ORDER == "top":
    ret.retention_order = top_order
REPEAT_IDS = []
if __name__ == "__main__":
    from cli.main import app
    sys.argv = ["kvlink-rag"] + sys.argv[1:]
    app()
