import torch
torch.set_num_threads(2)
torch.manual_seed(0)
for (o, i) in ((960, 576), (3072, 576), (576, 1536)):
    w = torch.randn(o, i).bfloat16()
    p = torch.ops.mkldnn._reorder_linear_weight(w, 64)
    X = torch.randn(600, i).bfloat16()
    ref_plain = torch.nn.functional.linear(X[:1], w)
    bad_plain = bad_packed = cross = 0
    for M in (1, 2, 7, 16, 22, 33, 64, 100, 128, 257, 600):
        a = torch.nn.functional.linear(X[:M], w)
        b = torch.ops.mkldnn._linear_pointwise(X[:M], p, None, "none", [], "")
        bad_plain += not torch.equal(a[:1], ref_plain)
        bad_packed += not torch.equal(b[:1], ref_plain)
        cross += not torch.equal(a, b)
    print((o, i), "plain row0 differs:", bad_plain, "packed row0 differs:", bad_packed, "packed!=plain:", cross)
