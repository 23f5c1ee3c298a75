import time, torch
from cli.common import make_settings, make_engine
from kvlink_rag.runtime.model_runner import get_runner
from kvlink_rag.runtime.kv_sequence import SequenceKV
from kvlink_rag.runtime.ragged import RaggedBatch
engine = make_engine(make_settings())
lm = engine.lm
runner = get_runner(lm)
print("adapter", engine.adapter, lm.adapters)
cfg = lm.config
def bench(adapter, n=150):
    seq = SequenceKV([], lm.num_layers, cfg.num_key_value_heads, lm.head_dim, lm.kv_dtype, lm.device, 1300 + n + 8)
    seq.append(torch.randn(lm.num_layers, cfg.num_key_value_heads, 1300, lm.head_dim).to(lm.kv_dtype),
               torch.randn(lm.num_layers, cfg.num_key_value_heads, 1300, lm.head_dim).to(lm.kv_dtype))
    ts = []
    for i in range(n):
        b = RaggedBatch(); b.add(seq, 1)
        e = lm.embed_tokens(torch.tensor([100 + i]))
        t = time.perf_counter()
        runner.forward(b, e, torch.tensor([1300 + i]), adapter)
        ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3
for _ in range(2):
    print(f"no adapter {bench(None):.2f} ms, adapter {bench(engine.adapter):.2f} ms", flush=True)
