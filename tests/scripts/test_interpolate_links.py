"""scripts/interpolate_links.py: two artifacts in, their interpolation written; bad input a one-line error."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.linking.link_tokens import LinkTokens, read_link_tokens


def test_writes_the_interpolation_and_refuses_a_missing_file(tmp_path, script, capsys):
    LinkTokens(torch.zeros(2, 4), "fp").save(tmp_path / "a.safetensors")
    LinkTokens(torch.ones(2, 4), "fp").save(tmp_path / "b.safetensors")
    run = script("interpolate_links").main
    run([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--weight", "0.75",
         "--out", str(tmp_path / "c.safetensors")])
    got = read_link_tokens(tmp_path / "c.safetensors")
    assert torch.equal(got.embeds, torch.full((2, 4), 0.75)) and got.metadata["weight"] == 0.75
    with pytest.raises(SystemExit) as exit_:
        run([str(tmp_path / "a.safetensors"), str(tmp_path / "nope.safetensors"), "--weight", "0.5",
             "--out", str(tmp_path / "d.safetensors")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("nope.safetensors does not exist")
    with pytest.raises(SystemExit):
        run([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--weight", "0.5", "--part", "mlp",
             "--out", str(tmp_path / "d.safetensors")])
    assert "--part ['mlp']: expected SUBSTRING=W" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a safetensors file")
    with pytest.raises(SystemExit) as exit_:
        run([str(tmp_path / "notes.txt"), str(tmp_path / "b.safetensors"), "--weight", "0.5", "--out",
             str(tmp_path / "f.safetensors")])
    assert exit_.value.code == 2 and "is not a safetensors file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--weight", "0.5", "--part", "=0.3",
             "--out", str(tmp_path / "g.safetensors")])
    assert "a non-empty SUBSTRING" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_:  # --out under a file: an OSError on save
        run([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--weight", "0.5",
             "--out", str(tmp_path / "file" / "h.safetensors")])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("interpolate_links: ")
    run([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--weight", "0.5", "--part",
         "link_embeds=1", "--out", str(tmp_path / "e.safetensors")])
    assert torch.equal(read_link_tokens(tmp_path / "e.safetensors").embeds, torch.ones(2, 4))
