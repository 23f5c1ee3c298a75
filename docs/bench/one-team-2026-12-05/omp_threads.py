import sys, time, threading, torch, numpy as np
nt = int(sys.argv[1]); torch.set_num_threads(nt)
a = torch.randn(16, 3072); b = torch.empty_like(a)
w = torch.randn(3072, 576).bfloat16(); x = torch.randn(16, 576).bfloat16()
W = [torch.randn(3072, 576).bfloat16() for _ in range(60)]
na = np.random.rand(4_000_000); nb = np.empty_like(na)
def bench(f, r=2000):
    for _ in range(50): f()
    t0 = time.perf_counter()
    for _ in range(r): f()
    return (time.perf_counter() - t0) / r * 1e6
def run(tag):
    torch.set_num_threads(nt)
    print(tag, torch.get_num_threads(),
          f"copy_ {bench(lambda: b.copy_(a)):.2f}us",
          f"np copy 32MB {bench(lambda: np.copyto(nb, na), 50):.0f}us",
          f"mm cached {bench(lambda: torch.mm(x, w.t()), 500):.0f}us",
          f"mm 60 weights {bench(lambda: [torch.mm(x, v.t()) for v in W], 20):.0f}us", flush=True)
run("main")
t = threading.Thread(target=run, args=("thread",)); t.start(); t.join()
run("main")
