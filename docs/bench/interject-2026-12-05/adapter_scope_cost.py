import time
from cli.common import make_engine, make_settings
from kvlink_rag.model.lora import adapter_scope, runner_adapter
e = make_engine(make_settings())
for name, cm in (("adapter_scope", adapter_scope), ("runner_adapter", runner_adapter)):
    for _ in range(3):
        with cm(e.lm, e.adapter): pass
    t0 = time.perf_counter()
    for _ in range(20):
        with cm(e.lm, e.adapter): pass
    print(name, "%.2f ms per enter+exit" % ((time.perf_counter() - t0) / 20 * 1e3))
