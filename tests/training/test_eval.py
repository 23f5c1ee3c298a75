"""The evaluation harness on a tiny random model: rows, gold-position rotation, resume, merging, intervals."""

from __future__ import annotations

import json

import pytest

from factories import tiny_text_engine
from evaluation.nq import NQExample
from kvlink_rag.types import Document
from training.eval import bootstrap_ci, evaluate, position_for, read_rows, summarise


def _examples(n: int = 8) -> list[NQExample]:
    words = ["red", "blue", "green", "black", "white", "pink", "gold", "grey", "brown", "cyan"]
    return [NQExample(f"what colour is thing {i}?", (words[i],), Document(f"Thing {i} is {words[i]}.", f"Thing {i}"))
            for i in range(n)]


def _row(i, pos, mode, em, nll=1.0, ttft=0.1) -> dict:
    return {"index": i, "gold_position": pos, "mode": mode, "em": em, "nll": nll, "ttft_s": ttft}


def test_rotate_cycles_first_middle_last_and_leaves_fixed_positions():
    assert [position_for("rotate", i) for i in range(5)] == ["first", "middle", "last", "first", "middle"]
    assert position_for("last", 4) == "last" and position_for("random", 1) == "random"


def test_evaluate_writes_one_row_per_question_and_mode_and_resumes(tmp_path):
    engine = tiny_text_engine(tmp_path)
    ex, rows_path = _examples(), tmp_path / "r.rows.jsonl"
    rows = evaluate({"full": engine, "naive": engine}, ex, 3, 4, ["rotate"], max_new_tokens=2, rows_path=rows_path)
    assert [(r["index"], r["gold_position"], r["mode"]) for r in rows] == [
        (0, "first", "full"), (0, "first", "naive"), (1, "middle", "full"), (1, "middle", "naive"),
        (2, "last", "full"), (2, "last", "naive")]
    assert [r["gold_slot"] for r in rows[::2]] == [0, 2, 3]  # 4 documents: first, middle (4 // 2), last
    assert all(r["em"] in (0.0, 1.0) and r["nll"] > 0 and r["ttft_s"] > 0 for r in rows)
    assert len(rows_path.read_text().splitlines()) == 6
    calls = []
    again = evaluate({"full": engine, "naive": engine}, ex, 4, 4, ["rotate"], max_new_tokens=2,
                     rows_path=rows_path, progress=lambda: calls.append(1))
    assert len(again) == 8 and len(rows_path.read_text().splitlines()) == 8  # only question 3 was scored
    assert again[:6] == [json.loads(line) for line in rows_path.read_text().splitlines()[:6]]
    assert len(calls) == 4


def test_shards_from_start_score_their_questions_and_merge_to_the_whole_run(tmp_path):
    engine = tiny_text_engine(tmp_path)
    ex = _examples()
    whole = evaluate({"naive": engine}, ex, 5, 3, ["rotate"], max_new_tokens=2)
    head = evaluate({"naive": engine}, ex, 2, 3, ["rotate"], max_new_tokens=2, rows_path=tmp_path / "a.rows.jsonl")
    tail = evaluate({"naive": engine}, ex, 5, 3, ["rotate"], max_new_tokens=2, rows_path=tmp_path / "b.rows.jsonl",
                    start=2)
    assert [r["index"] for r in tail] == [2, 3, 4] and [r["gold_position"] for r in tail] == ["last", "first", "middle"]
    merged = read_rows([tmp_path / "a.rows.jsonl", tmp_path / "b.rows.jsonl"])
    strip = [{k: v for k, v in r.items() if k != "ttft_s"} for r in merged]
    assert strip == [{k: v for k, v in r.items() if k != "ttft_s"} for r in head + tail]
    assert [(r["index"], r["answer"], r["em"]) for r in head + tail] == [(r["index"], r["answer"], r["em"]) for r in whole]


def test_a_tag_labels_rows_so_runs_of_one_mode_merge_side_by_side(tmp_path):
    engine = tiny_text_engine(tmp_path)
    plain = evaluate({"full": engine, "naive": engine}, _examples(), 2, 3, ["first"], max_new_tokens=2)
    a = evaluate({"full": engine, "naive": engine}, _examples(), 2, 3, ["first"], max_new_tokens=2,
                 rows_path=tmp_path / "a.rows.jsonl", tag="@a")
    assert [r["mode"] for r in a] == ["full@a", "naive@a"] * 2
    assert [(r["answer"], r["nll"]) for r in a] == [(r["answer"], r["nll"]) for r in plain]  # the same modes ran
    evaluate({"naive": engine}, _examples(), 2, 3, ["first"], max_new_tokens=2, rows_path=tmp_path / "b.rows.jsonl",
             tag="@b")
    merged = read_rows([tmp_path / "a.rows.jsonl", tmp_path / "b.rows.jsonl"])
    assert sorted({r["mode"] for r in merged}) == ["full@a", "naive@a", "naive@b"] and len(merged) == 6


def test_full_prefill_and_naive_reuse_of_one_document_agree(tmp_path):
    # one document, K=0: the reused cache is the full prefill's, so answer and NLL match
    engine = tiny_text_engine(tmp_path, link_k=0, kv_dtype="float32")
    rows = evaluate({"full": engine, "naive": engine}, _examples(), 2, 1, ["first"], max_new_tokens=3)
    for full, naive in zip(rows[::2], rows[1::2]):
        assert full["answer"] == naive["answer"]
        assert full["nll"] == pytest.approx(naive["nll"], abs=1e-3)


def test_summarise_per_mode_and_position():
    rows = [_row(0, "first", "full", 1.0, nll=2.0), _row(1, "middle", "full", 0.0, nll=4.0),
            _row(0, "first", "naive", 0.0, ttft=0.3), _row(1, "middle", "naive", 0.0, ttft=0.1)]
    s = summarise(rows)
    assert s["modes"]["full"]["accuracy"] == 0.5 and s["modes"]["full"]["answer_nll"] == 3.0
    assert s["modes"]["naive"]["ttft_s"] == 0.3 and s["modes"]["naive"]["n"] == 2  # upper median of two
    assert s["by_position"]["first"]["full"]["accuracy"] == 1.0
    assert s["by_position"]["middle"]["full"]["accuracy"] == 0.0


def test_bootstrap_interval_brackets_the_mean_and_is_degenerate_for_constants():
    values = [1.0] * 30 + [0.0] * 70
    lo, hi = bootstrap_ci(values)
    assert lo < 0.3 < hi and hi - lo < 0.25
    assert bootstrap_ci([1.0] * 10) == (1.0, 1.0)
    assert bootstrap_ci([]) == (0.0, 0.0)


def test_read_rows_merges_files_and_rejects_bad_ones(tmp_path):
    a, b = tmp_path / "a.rows.jsonl", tmp_path / "b.rows.jsonl"
    a.write_text(json.dumps(_row(0, "first", "full", 0.0)) + "\n" + json.dumps(_row(1, "middle", "full", 1.0)) + "\n")
    b.write_text(json.dumps(_row(0, "first", "full", 1.0)) + "\n\n" + json.dumps(_row(0, "first", "naive", 0.0)) + "\n")
    rows = read_rows([a, b])
    assert sorted((r["index"], r["mode"], r["em"]) for r in rows) == [(0, "full", 1.0), (0, "naive", 0.0),
                                                                     (1, "full", 1.0)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not an eval row"):
        read_rows([bad])
    with pytest.raises(ValueError, match="does not exist"):
        read_rows([tmp_path / "missing.jsonl"])


def test_summary_markdown_has_one_row_per_mode_and_position_columns():
    from training.eval import summary_markdown

    rows = [_row(0, "first", "full", 1.0), _row(1, "middle", "full", 0.0), _row(0, "first", "naive", 0.0)]
    text = summary_markdown(summarise(rows))
    lines = text.splitlines()
    assert lines[0].startswith("| mode | accuracy [95% CI]") and "first [95% CI] | middle [95% CI] |" in lines[0]
    assert lines[2].startswith("| full | 0.500 [") and lines[2].endswith("| 1.000 [1.000, 1.000] | 0.000 [0.000, 0.000] |")
    assert lines[3].endswith("| 0.000 [0.000, 0.000] | - |")  # naive was not run with gold in the middle


def test_paired_difference_pairs_questions_and_scales_the_baseline():
    from training.eval import paired_difference

    rows = [_row(i, "first", "a", 1.0) for i in range(10)] + [_row(i, "first", "b", float(i < 5)) for i in range(10)]
    rows.append(_row(99, "first", "a", 1.0))  # not answered by b: left out
    d, lo, hi = paired_difference(rows, "a", "b")
    assert d == 0.5 and lo <= 0.5 <= hi and 0.1 < lo
    d95, _, _ = paired_difference(rows, "a", "b", scale=0.95)
    assert abs(d95 - (1 - 0.95 * 0.5)) < 1e-12
    assert paired_difference(rows, "a", "missing") is None
    nll = [_row(i, "first", "a", 1.0, nll=1.0 + i) for i in range(4)] + [_row(i, "first", "b", 1.0, nll=2.0 * (1 + i))
                                                                          for i in range(4)]
    d, lo, hi = paired_difference(nll, "a", "b", field="nll")  # per question -(1 + i)
    assert d == -2.5 and -4.0 <= lo <= d <= hi <= -1.0
