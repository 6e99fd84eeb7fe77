"""benchmarks/studies/cram_search.py (issue 18, item 5): the CPU cramming search runs end to end on real
Wikipedia text in --smoke, resumes without retraining, writes a recipe ember trains, and its
ranking metric and its coordinate-search rule are right. Not a measurement."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import real_data
from ember.errors import EmberError


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("cram_search")


@pytest.fixture(scope="module")
def smoke(bench, tmp_path_factory):
    """One --smoke search (two vocabularies made from real text, 4 screening trials, the top 2 at
    two budgets, fine-tuning on real SST-2 and CoLA), shared by the tests that read its outputs."""
    for parts in (("wiki-en", "AA", "wiki_00.gz"), ("glue", "SST-2", "train.tsv"), ("glue", "CoLA", "train.tsv")):
        real_data(*parts)
    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("cram")
    result = bench.main(["--smoke", "--out", str(out)])
    torch.set_num_threads(threads)
    return out, result


def _records(out):
    return {p.parent.name: p for p in (out / "trials").glob("*/record.json")}


def test_smoke_search_writes_the_ranked_table_the_curves_the_recipe_and_the_finetuning(smoke):
    out, result = smoke
    table = json.loads((out / "table.json").read_text())
    stages = [(t["stage"], t["budget"]) for t in table["trials"]]
    assert stages.count(("screen", 1.0)) == 4  # the baseline, one other lr, the other LN, the other vocabulary
    assert stages.count(("budget", 1.0)) == stages.count(("budget", 2.0)) == 2  # the top 2 at each budget
    screened = [t for t in table["trials"] if t["stage"] == "screen"]
    assert [t["rank"] for t in screened] == [1, 2, 3, 4]
    assert all(a["bits_per_char"] <= b["bits_per_char"] for a, b in zip(screened, screened[1:]))
    assert {t["config"]["vocab"] for t in screened} == {600, 1000}
    winner = table["winner"]
    assert winner["budget"] == 2.0 and winner["name"] in (out / "table.md").read_text()
    assert winner["bits_per_char"] == min(t["bits_per_char"] for t in table["trials"] if t["budget"] == 2.0
                                          and t["stage"] == "budget")
    assert 0 < winner["bits_per_char"] < 10 and winner["steps"] > 0 and winner["tokens"] > 0
    assert (out / "curves.png").stat().st_size > 10_000
    recipe = (out / "bert-cram-cpu.yaml").read_text()
    assert recipe.startswith("# bert-cram-cpu: found by benchmarks/studies/cram_search.py") and "objective: mlm" in recipe
    finetune = result["finetune"]["table"]
    for task in ("sst2", "cola"):
        assert finetune[task]["dev"]["pretrained"]["n"] == finetune[task]["dev"]["random"]["n"] == 2
    assert "random init, same shape" in result["text"]


def test_written_recipe_trains_with_ember_pretrain(smoke, tmp_path):
    import ember
    from ember.runs.folder import load_run_config

    out, result = smoke
    winner = result["winner"]
    run = ember.pretrain(out / "bert-cram-cpu.yaml", tmp_path / "run", data=winner["data"],
                         overrides=["train.max_steps=3"], progress=False)
    assert run.runs[0]["step"] == 3
    cfg = load_run_config(tmp_path / "run")
    assert cfg.objective == "mlm" and cfg.train.schedule == "time" and cfg.train.max_time == winner["budget"]
    assert cfg.train.lr == winner["config"]["lr"] and cfg.model.pre_layer_norm == winner["config"]["pre_ln"]


def test_rerun_resumes_without_retraining_and_a_worker_process_redoes_a_lost_trial(bench, smoke):
    out, _ = smoke
    before = {name: path.stat().st_mtime_ns for name, path in _records(out).items()}
    again = bench.main(["--smoke", "--out", str(out)])
    assert again["trained"] == 0
    assert {name: path.stat().st_mtime_ns for name, path in _records(out).items()} == before
    # a screening trial far from the top (the other vocabulary) lost its record: only it is trained
    # again, in a worker process, and the winner stays
    lost = next(name for name, path in _records(out).items() if json.loads(path.read_text())["config"]["vocab"] == 600)
    _records(out)[lost].unlink()
    third = bench.main(["--smoke", "--out", str(out), "--workers", "2"])
    assert third["trained"] == 1 and third["winner"]["name"] == again["winner"]["name"]
    assert json.loads(_records(out)[lost].read_text())["status"] == "done"
    assert "pre-training mlm" in (out / "trials" / lost / "log.txt").read_text()


def test_screen_only_stops_after_the_screening_and_the_full_run_continues_from_it(bench, tmp_path):
    real_data("wiki-en", "AA", "wiki_00.gz")
    out = tmp_path / "cram"
    first = bench.main(["--smoke", "--out", str(out), "--screen-only"])
    assert first["trained"] == 4 and len(first["screened"]) == 4
    assert {r["stage"] for r in first["screened"]} == {"screen"} and not (out / "table.md").exists()
    rows = [line for line in (out / "screening.md").read_text().splitlines() if line.startswith("| ") and "screen" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2", "| 3", "| 4"]  # ranked, best first
    before = {name: path.stat().st_mtime_ns for name, path in _records(out).items()}
    rest = bench.main(["--smoke", "--out", str(out), "--finetune"])
    # no screening trial again: the top 2 at each of the 2 budgets, then 2 variants x 2 tasks
    assert rest["trained"] == 4 + 4
    assert all(_records(out)[name].stat().st_mtime_ns == t for name, t in before.items())
    # other fine-tuning settings: only the 2 variants x 2 tasks again, beside the first settings' runs
    other = bench.main(["--smoke", "--out", str(out), "--finetune", "--finetune-lr", "3e-3", "--finetune-dropout", "0"])
    assert other["trained"] == 4 and "peak lr 0.003, dropout 0;" in (out / "table.md").read_text()
    assert len(list((out / "finetune").glob("*/*/record.json"))) == 8


def test_protocol_cross_entropy_equals_embers_held_out_evaluation_on_the_same_sequences(bench, smoke):
    from pathlib import Path

    from ember.runs.folder import load_run_config
    from ember.runs.folder import last_evaluation

    run = Path(smoke[1]["winner"]["dir"]) / "run"
    cfg = load_run_config(run)
    mine = bench.heldout_eval(run, cfg.data.max_seq_length, cfg.data.eval_examples)
    theirs = last_evaluation(run)
    assert mine["heldout_ce"] == pytest.approx(theirs["mlm_loss"], abs=1e-5)
    assert mine["heldout_acc"] == pytest.approx(theirs["mlm_acc"], abs=1e-9)


def test_bits_per_character_on_a_hand_checked_case():
    metric = load_benchmark("_cram_eval")
    ln2 = math.log(2)
    # 1 + 1 + 2 + 3 bits over "the" + "s" + "a" + one character for [UNK] = 7 bits / 6 characters
    nats = [ln2, ln2, 2 * ln2, 3 * ln2]
    assert metric.bits_per_char(nats, ["the", "##s", "a", "[UNK]"], frozenset({"[UNK]"})) == pytest.approx(7 / 6)
    assert metric.token_chars("##ing") == 3 and metric.token_chars("\u0120world") == 5  # byte-level BPE's word start
    assert metric.token_chars("\u2581de") == 2 and metric.token_chars("##") == 1


def test_coordinate_search_keeps_a_change_only_when_it_lowers_the_metric(bench):
    base = {"lr": 1, "pre_ln": False}
    b, c = {"lr": 2, "pre_ln": False}, {"lr": 3, "pre_ln": False}
    assert bench.select(base, 1.0, [(b, 0.98), (c, 0.99)]) == (b, 0.98)
    assert bench.select(base, 1.0, [(b, 1.0), (c, None)]) == (base, 1.0)  # a tie or a diverged run: keep
    assert bench.select(base, 1.0, [(b, math.inf)]) == (base, 1.0)
    assert bench.select(base, 1.0, [(b, 0.995)], min_gain=0.01) == (base, 1.0)
    # fake trials: lr 2 helps, pre-LN hurts; the search keeps lr 2 and post-LN, one evaluation per value
    score = {(1, False): 1.0, (2, False): 0.9, (3, False): 0.95, (2, True): 0.93}
    seen = []

    def evaluate(configs):
        seen.extend(configs)
        return [{"status": "done", "bits_per_char": score[(c["lr"], c["pre_ln"])]} for c in configs]

    best = bench.coordinate_search(base, {"lr": [1, 2, 3], "pre_ln": [False, True]}, ["lr", "pre_ln"], 1,
                                   evaluate, log=lambda line: None)
    assert best == {"lr": 2, "pre_ln": False} and len(seen) == 4


def test_budget_runs_take_the_best_of_each_shape_before_the_next_best_overall(bench):
    def trial(shape, lr, bits):
        return {"config": {"shape": shape, "lr": lr}, "status": "done", "bits_per_char": bits}

    screened = [trial("2x128", 1, 2.40), trial("2x128", 2, 2.41), trial("2x128", 3, 2.42),
                trial("4x256", 1, 2.50), trial("4x256", 2, 2.45), trial("6x256", 1, 2.55),
                {"config": {"shape": "8x256", "lr": 1}, "status": "diverged"}]
    # the smallest shape's three variants lead the screening; the budgets still see the other shapes
    assert bench.budget_candidates(screened, 2) == [{"shape": "2x128", "lr": 1}, {"shape": "4x256", "lr": 2}]
    assert bench.budget_candidates(screened, 3)[2] == {"shape": "6x256", "lr": 1}
    # more places than shapes (a diverged shape is no candidate): then the next best overall
    assert bench.budget_candidates(screened, 5)[3:] == [{"shape": "2x128", "lr": 2}, {"shape": "2x128", "lr": 3}]


@pytest.mark.parametrize("argv, message", [
    (["--space", "bogus=1,2"], "unknown knob"),
    (["--knobs", "lr,widths"], "unknown knob"),
    (["--space", "lr=fast"], "not a valid value"),
    (["--baseline", "shape=4x250"], "not divisible"),
    (["--budgets", "30m,1 hour"], "cannot read duration"),
    (["--space", "seq=1024"], "exceeds model.max_position"),
])
def test_bad_input_is_refused_before_anything_is_written(bench, tmp_path, argv, message):
    out = tmp_path / "out"
    with pytest.raises(EmberError, match=message):
        bench.main(argv + ["--out", str(out)])
    assert not out.exists()


def test_an_empty_corpus_is_refused_before_anything_is_written(bench, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(EmberError, match="no text"):
        bench.main(["--corpus", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
