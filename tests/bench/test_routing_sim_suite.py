"""The routing-sim suite end to end on a small fleet (no model, no NQ file needed): every row, the bounds and
the BENCHMARKS.md section; and the what-if rendezvous ranking's decisions."""

from bench.report import markdown
from bench.routing_sim import Setup
from bench.routing_sim_suite import POLICIES, routing_sim_suite
from bench.routing_sim_variants import rendezvous_home, with_home
from router.scoring import ReplicaView, Weights


def test_the_suite_fills_every_row_and_the_section_renders():
    res = routing_sim_suite(None, None, n_docs=100, n_queries=300, docs_per_query=3, seeds=(0, 1),
                            setup=Setup(replicas=2, clients=4, warmup=100), scenarios={"steady": None, "restart": 200},
                            log=lambda m: None)
    assert res["setup"]["token_counts"] == "140 tokens each (no NQ file)"
    for run in res["runs"].values():
        for block in run.values():
            assert set(block["policies"]) == set(POLICIES)
            for row in block["policies"].values():
                assert len(row["seeds"]) == 2 and 0 < row["hit_rate_docs"] < 1 and row["max_min_load"] >= 1
    text = markdown({"machine": {"platform": "test", "model": None}, "started": "now", "routing_sim": res}, "kvlink-rag bench (test)")
    assert "## Router policies in a model-free simulation" in text and "| document-aware |" in text
    assert "token hit rate for 0.6x" in text


def test_the_rendezvous_what_if_sends_unheld_documents_home_unless_every_replica_holds_them():
    reps = [ReplicaView(x) for x in "abcd"]
    docs = [("k7", 100)]
    home = rendezvous_home("k7", [r.id for r in reps])
    assert with_home(1.0)(docs, reps, Weights())[0].id == home
    everywhere = [ReplicaView(x, {"k7": {"host"}}) for x in "abcd"]  # a hot document: no pull, ids break the tie
    assert with_home(1.0)(docs, everywhere, Weights())[0].id == "a"
