"""benchmarks/studies/time_to_loss.py and its reference loop (benchmarks/common/_hf_reference.py): the two
sides train on the same batches, are scored by the same held-out function, and the report
reads ember's time to the reference's final loss off the curves."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)

transformers = pytest.importorskip("transformers")

TINY = ["objective=mlm", "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
        "model.intermediate_size=64", "model.max_position=64", "data.max_seq_length=64",
        "data.eval_examples=24", "train.batch_size=4", "model.dropout=0", "model.attention_dropout=0"]


def _setup(wiki_prepared, tmp_path, extra=()):
    from ember.objectives.setup import setup_pretraining

    tta = load_benchmark("time_to_accuracy")
    from ember.data.shards import TokenCorpus

    vocab = TokenCorpus(wiki_prepared, "train").vocab_size
    cfg = tta.recipe_config("bert-mini", TINY + [f"model.vocab_size={vocab}", *extra])
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared=str(wiki_prepared)))
    torch.manual_seed(0)
    return cfg, setup_pretraining(cfg, tmp_path / "run", False, False)


def _hf_twin(setup):
    """transformers' BertForMaskedLM holding the ember objective's weights."""
    from ember.interop.hf_bert import state_to_hf

    ref = load_benchmark("_hf_reference")
    m = setup.cfg.model
    model = transformers.BertForMaskedLM(ref.hf_bert_config(m))
    missing, unexpected = model.load_state_dict(state_to_hf(setup.module.state_dict(), m), strict=False)
    # BertForMaskedLM has no pooler (MLM never reads it); its decoder is tied to the embeddings
    assert all("pooler" in k for k in unexpected) and all("decoder" in k for k in missing), (missing, unexpected)
    model.tie_weights()
    return ref, model


def test_bert_reference_held_out_metrics_equal_embers_on_the_same_weights(wiki_prepared, tmp_path):
    # The two curves of the race are comparable only if the reference is scored exactly as
    # ember is: same held-out examples, same fixed masks, same loss. Real Wikipedia sequences.
    _, setup = _setup(wiki_prepared, tmp_path)
    ref, model = _hf_twin(setup)
    setup.module.eval()
    with torch.no_grad():
        ours = setup.evaluate(setup.module)
        for head in ref.HEADS:
            theirs = setup.evaluate(ref.HFMaskedLM(model.eval(), setup.module, head))
            assert theirs["mlm_loss"] == pytest.approx(ours["mlm_loss"], abs=1e-5)
            assert theirs["mlm_acc"] == pytest.approx(ours["mlm_acc"], abs=1e-9)
    assert 5.0 < ours["mlm_loss"] < 9.0  # near ln(2000) = 7.6 for a random model: a real loss, not 0


def test_bert_reference_full_and_masked_heads_train_on_the_same_loss(wiki_prepared, tmp_path):
    # run_mlm's full-vocabulary head and the masked-rows head differ in cost, not in the loss
    # (training mode; dropout is 0 in TINY so the two passes are deterministic)
    cfg, setup = _setup(wiki_prepared, tmp_path)
    ref, model = _hf_twin(setup)
    order = ref.DataOrder(len(setup.train_data), cfg.train.seed)
    batch = ref.trainer_batches(setup.module, setup.train_data, order, cfg.train, 0)[0]
    full, _ = ref.HFMaskedLM(model.train(), setup.module, "full")(batch)
    masked, _ = ref.HFMaskedLM(model.train(), setup.module, "masked")(batch)
    ours, _ = setup.module.train()(batch)
    assert full.item() == pytest.approx(masked.item(), abs=1e-5)
    assert full.item() == pytest.approx(ours.item(), abs=1e-5)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_bert_reference_draws_the_batches_embers_trainer_trains_on(wiki_prepared, tmp_path, grad_accum):
    from ember.train.loop import Trainer

    cfg, setup = _setup(wiki_prepared, tmp_path, [f"train.grad_accum={grad_accum}"])
    ref = load_benchmark("_hf_reference")
    trainer = Trainer(setup.module, setup.train_data, cfg.train, tmp_path / "trainer", progress=False)
    seen = []

    def recorder(batch):
        seen.append(batch)
        return setup.module(batch)

    order = ref.DataOrder(len(setup.train_data), cfg.train.seed)
    for step in range(3):
        seen.clear()
        trainer.train_step(recorder)
        trainer.step += 1
        ours = ref.trainer_batches(setup.module, setup.train_data, order, cfg.train, step)
        assert len(ours) == len(seen) == grad_accum
        for a, b in zip(ours, seen):
            assert a.keys() == b.keys()
            for name in a:
                assert torch.equal(a[name], b[name]), (step, name)


def test_time_to_reach_interpolates_between_evaluations():
    bench = load_benchmark("time_to_loss")
    rows = [{"elapsed": 100.0, "loss": 9.0}, {"elapsed": 200.0, "loss": 7.0}, {"elapsed": 300.0, "loss": 6.0}]
    assert bench.time_to(rows, "loss", 8.0) == {"seconds": 150.0, "bound": False}
    assert bench.time_to(rows, "loss", 6.5) == {"seconds": 250.0, "bound": False}
    assert bench.time_to(rows, "loss", 9.5) == {"seconds": 100.0, "bound": True}  # already there at the first
    assert bench.time_to(rows, "loss", 5.0) is None
    accs = [{"elapsed": 10.0, "acc": 0.1}, {"elapsed": 20.0, "acc": 0.3}]
    assert bench.time_to(accs, "acc", 0.2, lower=False)["seconds"] == pytest.approx(15.0)


def test_time_to_loss_smoke_runs_each_side_then_reports_curves_and_the_ratio(wiki_prepared, tmp_path):
    bench = load_benchmark("time_to_loss")
    out = tmp_path / "ttl"
    common = ["--smoke", "--data", str(wiki_prepared), "--out", str(out)]
    assert bench.main(common + ["--side", "ember"]) is None  # the other side is not there yet
    with pytest.raises(SystemExit, match="reference"):
        bench.main(["--out", str(out), "--report"])
    result = bench.main(common + ["--side", "reference"])  # both done: the report follows
    assert result["setup"]["recipe"] == "bert-mini" and "train.clock=cpu" in result["setup"]["overrides"]
    for side in ("ember", "reference"):
        curve = result[side]["curve"]
        assert len(curve) >= 2 and all(a["elapsed"] <= b["elapsed"] for a, b in zip(curve, curve[1:]))
        assert all(0.0 < r["mlm_loss"] < 20.0 and 0.0 <= r["mlm_acc"] <= 1.0 for r in curve)
    # the reference's budget (4 CPU-s in the smoke) is spent before its last evaluation
    assert result["reference"]["curve"][-1]["elapsed"] >= 4.0
    hit = result["reference"]["ember_time_to_mlm_loss"]
    if hit is not None:
        assert hit["ratio"] == pytest.approx(hit["seconds"] / result["reference"]["curve"][-1]["elapsed"])
    assert result["target_met"] == (hit is not None and hit["ratio"] <= 0.5)
    # the informed user's loop (head at the masked rows) joins the report as a second yardstick
    assert "reference-masked" not in result["sides"]
    both = bench.main(common + ["--side", "reference-masked"])
    assert both["sides"] == ["ember", "reference", "reference-masked"]
    assert both["reference"]["curve"] == result["reference"]["curve"]
    assert both["target_met"] == result["target_met"]  # the target stays run_mlm's
    assert (out / "curves.png").stat().st_size > 10_000
    assert "| ember |" in (out / "table.md").read_text()
    again = bench.main(["--out", str(out), "--report"])  # the report alone reads the same folders
    assert json.loads(json.dumps(again["ember"]["curve"])) == result["ember"]["curve"]
