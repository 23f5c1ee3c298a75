"""Time one packed forward of n prefill tokens at c keys already in the sequence (full prefill chunking)."""
import sys, time, torch
from kvlink_rag.settings import EngineSettings as Settings
from kvlink_rag.model.loader import load_model
from kvlink_rag.runtime.kv_sequence import pooled_sequence
from kvlink_rag.runtime.ragged import RaggedBatch
from kvlink_rag.runtime.model_runner import forward_ragged, get_runner
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
from cli.common import make_settings, make_engine
from kvlink_rag.model.lora import runner_adapter
eng = make_engine(make_settings()); lm = eng.lm
ADAPTER = eng.adapter if len(sys.argv) > 2 and sys.argv[2] == "lora" else None
print("adapter", ADAPTER)
H = lm.config.hidden_size
emb = lm.model.get_input_embeddings()
def step(seq, n, c):
    b = RaggedBatch(); 
    m = torch.zeros(n, c + n)
    m[:, c:] = torch.triu(torch.full((n, n), float('-inf')), 1)
    b.add(seq, n, m)
    ids = torch.randint(100, 40000, (n,))
    e = emb(ids).to(lm.dtype)
    pos = torch.arange(c, c + n)
    t0 = time.perf_counter()
    with runner_adapter(lm, ADAPTER): forward_ragged(lm, b, e, pos)
    dt = time.perf_counter() - t0
    b.commit(); return dt
with torch.inference_mode():
  for c in (0, 3000):
    row = []
    for n in (16, 32, 64, 128, 256):
        ts = []
        for r in range(3):
            seq = pooled_sequence(lm, c + n + 8)
            # fill c keys cheaply: write random KV
            if c:
                k = torch.randn(lm.num_layers, 3, c, lm.head_dim).to(lm.kv_dtype)
                seq.put(0, k, k.clone()); seq.commit(c)
            ts.append(step(seq, n, c)); seq.release()
        row.append(f"n={n}:{min(ts)*1000:.0f}ms")
    print(f"c={c}", " ".join(row), flush=True)
