import time, torch, sys
from cli.common import make_settings, make_engine
from kvlink_rag.linking.rope import rope_cos_sin
torch.set_num_threads(2)
from kvlink_rag.settings import EngineSettings
from kvlink_rag.model.loader import load_model
lm = load_model(EngineSettings())
for n in (16, 100, 4096):
    pos = torch.randint(0, 4000, (n,))
    for _ in range(20): rope_cos_sin(lm.rotary_emb, pos, torch.float32)
    t0 = time.perf_counter()
    for _ in range(300): rope_cos_sin(lm.rotary_emb, pos, torch.float32)
    print(sys.argv[1], n, f"{(time.perf_counter()-t0)/300*1e6:.0f} us")
