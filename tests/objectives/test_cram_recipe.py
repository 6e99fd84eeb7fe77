"""The shipped `bert-cram-cpu` recipe (issue 18 item 5, found by benchmarks/studies/cram_search.py):
it trains on real Wikipedia text under its own CPU-time budget, with the searched settings, and
its learning rate decays to zero at the budget it is given."""

from __future__ import annotations

import json

from ember.cli import main


def test_bert_cram_cpu_recipe_trains_to_its_cpu_budget_on_real_text(wiki_prepared, tmp_path):
    run = tmp_path / "cram"
    assert main(["pretrain", "--recipe", "bert-cram-cpu", "--data", str(wiki_prepared), "--out", str(run),
                 "--max-time", "12s", "--no-progress", "--set", "train.log_every=5",
                 "--set", "train.eval_every=100000"]) == 0
    saved = (run / "config.yaml").read_text()
    for setting in ("pre_layer_norm: true", "dropout: 0.0", "num_layers: 2", "hidden_size: 128",
                    "max_seq_length: 64", "schedule: time", "clock: cpu"):
        assert setting in saved, setting
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    # the 12-second budget, not the step count, ended the run; the lr warmed up and decayed towards 0 over it
    assert len(train) > 10 and 0.9 * 12 <= train[-1]["elapsed"] <= 13
    peak = max(r["lr"] for r in train)
    assert peak > 5e-4 and train[-1]["lr"] < 0.2 * peak
    first, last = sum(r["mlm_loss"] for r in train[:3]) / 3, sum(r["mlm_loss"] for r in train[-3:]) / 3
    assert last < first - 0.5, (first, last)
