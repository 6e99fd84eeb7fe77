"""Each benchmark's --smoke mode runs (seconds on idle cores) and reports sane numbers, so the
benchmark scripts keep working as the library changes. These are not measurements."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmark_helpers import BENCHMARKS, keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)
from conftest import make_wordpiece, real_data


def test_pretrain_throughput_smoke_reports_rates_ratio_and_utilisation(tmp_path):
    bench = load_benchmark("pretrain_throughput")
    out = tmp_path / "r.json"
    (result,) = bench.main(["--smoke", "--cpu-time", "--variants", "ember", "ember-torch-dropout", "ember-bf16",
                            "--json", str(out), "--cuda", "off"])
    assert set(result["tokens_per_s"]) == {"ember", "ember-torch-dropout", "ember-bf16", "reference",
                                           "reference-masked", "reference-masked-bf16"}
    assert all(v > 0 for v in result["tokens_per_s"].values())
    assert 0 < result["utilisation"]["ember"] < 1.5
    assert result["ratio"]["ember"] > 0 and result["ratio_vs_masked"]["ember"] > 0
    assert len(result["ratio_vs_masked_each"]["ember"]) == 2  # one ratio per repetition
    # the bf16 contender is compared with the masked loop under the same autocast, and its
    # utilisation is against the bf16 peak measured beside the fp32 one
    rates = result["tokens_per_s"]
    assert result["ratio_vs_masked"]["ember-bf16"] == pytest.approx(rates["ember-bf16"] / rates["reference-masked-bf16"])
    assert result["bf16_peak_gflops"] > 0
    assert result["utilisation"]["ember-bf16"] == pytest.approx(
        rates["ember-bf16"] * result["useful_flops_per_token"] / (result["bf16_peak_gflops"] * 1e9))
    assert json.loads(out.read_text())[0]["masked"] == result["masked"]


def test_lm_loss_step_smoke_times_gpt_and_t5_with_and_without_the_fused_head(tmp_path):
    from ember.nn import linear_cross_entropy

    bench = load_benchmark("lm_loss_step")
    out = tmp_path / "r.json"
    results = bench.main(["--smoke", "--cpu-time", "--json", str(out)])
    assert [r["objective"] for r in results] == ["clm", "span_corruption"]
    for r in results:
        assert set(r["tokens_per_s"]) == {"fused", "logits"} and all(v > 0 for v in r["tokens_per_s"].values())
        assert len(r["speedup_each"]) == 2 and r["speedup"] > 0
    assert linear_cross_entropy.fusable(torch.ones(1), torch.ones(1))  # the switch is restored
    assert json.loads(out.read_text())[0]["vocab"] == 500


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the CUDA section runs instead")
def test_pretrain_throughput_without_a_gpu_records_why_the_cuda_section_was_skipped(capsys):
    bench = load_benchmark("pretrain_throughput")
    results = bench.main(["--smoke", "--cpu-time", "--cuda", "auto"])
    assert results[-1]["section"] == "cuda" and "no CUDA device" in results[-1]["skipped"]
    assert "CUDA section skipped: no CUDA device" in capsys.readouterr().out
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="--cuda on: no CUDA device"):
        bench.main(["--smoke", "--cpu-time", "--cuda", "on"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the bf16 MFU section)")
def test_pretrain_throughput_on_a_gpu_reports_bf16_mfu_for_ember_and_the_reference():
    bench = load_benchmark("pretrain_throughput")
    cuda = [r for r in bench.main(["--smoke", "--cuda", "on"]) if r.get("section") == "cuda"]
    (result,) = cuda
    assert set(result["tokens_per_s"]) == {"ember-cuda", "reference-masked-cuda"}
    assert all(0 < m < 1 for m in result["mfu"].values())
    assert result["bf16_peak_tflops"] > 1 and result["attention_kernel"] in ("flash", "memory-efficient", "math")


def test_pretrain_masked_rows_reference_has_run_mlms_loss():
    """The informed-user contender computes the same loss as BertForMaskedLM's full head."""
    bench = load_benchmark("pretrain_throughput")
    import dataclasses

    import transformers

    from ember.config import model_preset

    cfg = dataclasses.replace(model_preset("bert-tiny"), vocab_size=1500, num_layers=1)
    batch = bench.make_batch(cfg, 2, 16, 0.15)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=1500, hidden_size=cfg.hidden_size, num_hidden_layers=1, num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size)).eval()
    torch.testing.assert_close(bench._masked_rows_loss(hf, batch), hf(**batch).loss, rtol=1e-5, atol=1e-5)


def _tiny_sst2_run(folder: Path) -> Path:
    """A fine-tuned-run folder (random weights) that the inference benchmark can load."""
    from ember.config import ModelConfig, RunConfig, TaskConfig
    from ember.models import build_backbone
    from ember.tasks.classification import SequenceClassifier
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files

    words = ["the", "a", "film", "movie", "good", "bad", "is", "it", "not", "and", "of", "."]
    tok = folder / "tok.json"
    folder.mkdir(parents=True)
    make_wordpiece(words).save(str(tok))
    model = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_position=128)
    write_run_files(folder, RunConfig(kind="finetune", model=model, task=TaskConfig(name="sst2")), tok)
    torch.manual_seed(0)
    save_weights(SequenceClassifier(build_backbone(model), 2, 0).state_dict(), folder / "model.safetensors", {})
    return folder


def test_inference_smoke_agrees_with_the_reference_and_scores_sst2(tmp_path):
    real_data("glue", "SST-2", "dev.tsv")
    bench = load_benchmark("inference")
    result = bench.main(["--smoke", "--run", str(_tiny_sst2_run(tmp_path / "run"))])
    assert result["max_abs_diff"] < 1e-4  # same weights, same logits
    for row in result["fixed"]:
        assert set(row["sequences_per_s"]) == {"ember fp32", "reference fp32", "ember int8"}
    rows = result["sst2_dev"]["rows"]
    assert rows["ember fp32 (length-sorted)"]["agrees_with_ember_fp32"] == 1.0
    # the same fp32 weights predict the same labels however the batches are padded
    assert rows["reference fp32 (pad to 128)"]["agrees_with_ember_fp32"] == 1.0
    assert rows["reference fp32 (dynamic pad)"]["agrees_with_ember_fp32"] == 1.0
    assert 0 <= rows["ember int8 (length-sorted)"]["accuracy"] <= 1
    # ember's ONNX export is the same fp32 function: same predictions in the same order
    assert rows["ember ONNX fp32 (length-sorted)"]["agrees_with_ember_fp32"] == 1.0
    assert rows["ember ONNX fp32 (length-sorted)"]["accuracy"] == rows["ember fp32 (length-sorted)"]["accuracy"]
    assert 0 <= rows["ember ONNX int8 (length-sorted)"]["accuracy"] <= 1


def test_prepare_throughput_smoke_reports_overhead_and_memory(tmp_path):
    real_data("wiki-en", "AA", "wiki_00.gz")
    bench = load_benchmark("prepare_throughput")
    result = bench.main(["--smoke", "--json", str(tmp_path / "r.json")])
    assert all(v > 0 for v in result["mb_per_s"].values())
    assert [m["files"] for m in result["memory"]] == [1, 4]
    assert all(m["peak_mb"] > 0 for m in result["memory"])


@pytest.mark.slow
def test_time_to_accuracy_smoke_trains_both_and_fine_tunes_both(wiki_prepared, tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    bench = load_benchmark("time_to_accuracy")
    result = bench.main(["--smoke", "--cpu-time", "--data", str(wiki_prepared), "--out", str(tmp_path / "tta")])
    assert result["clock"] == "cpu"  # both budgets counted in CPU seconds
    for side in ("ember", "reference"):
        assert 0.0 <= result[side]["sst2"]["accuracy_mean"] <= 1.0
    assert result["reference"]["pretrain"]["steps"] >= 1
    assert (tmp_path / "tta" / "results.json").is_file()
    # --reuse-pretraining fine-tunes the same two pre-trained models again, pre-training nothing
    again = bench.main(["--smoke", "--cpu-time", "--reuse-pretraining", "--data", str(wiki_prepared),
                        "--out", str(tmp_path / "tta")])
    assert again["reference"]["pretrain"] == {k: v for k, v in result["reference"]["pretrain"].items() if k != "wall_s"}
    assert again["ember"]["pretrain"]["step"] == result["ember"]["pretrain"]["step"]
    assert again["ember"]["sst2"]["accuracies"] == result["ember"]["sst2"]["accuracies"]  # same seeds, same data


def _sst2_tokenizer(folder: Path) -> Path:
    """A 1,000-piece WordPiece tokenizer trained on 3,000 real SST-2 training sentences (< 1 s)."""
    from ember.tokenizers import train_tokenizer

    rows = real_data("glue", "SST-2", "train.tsv").read_text(encoding="utf-8").splitlines()[1:3001]
    text = folder / "sst2.txt"
    text.write_text("\n".join(row.split("\t")[0] for row in rows), encoding="utf-8")
    path = folder / "tokenizer.json"
    train_tokenizer([text], vocab_size=1000, progress=False).save(str(path))
    return path


def test_distill_table_smoke_scores_a_teacher_and_a_kd_student_on_every_path(tmp_path):
    from ember.cli import main
    from ember.errors import EmberError

    real_data("glue", "SST-2", "dev.tsv")
    tok = _sst2_tokenizer(tmp_path)
    teacher, student, out = tmp_path / "teacher", tmp_path / "kd", tmp_path / "table"
    # bert-tiny from scratch: ~150 steps at batch 8 lift it above always-the-majority-class
    # (a constant model would make the fp32/ONNX comparison below vacuous).
    assert main(["finetune", "--task", "sst2", "--init", "random", "--model", "bert-tiny", "--tokenizer", str(tok),
                 "--train-limit", "600", "--epochs", "2", "--batch-size", "8", "--lr", "1e-3", "--max-length", "48",
                 "--no-progress", "--out", str(teacher)]) == 0
    # One teacher layer as the start (DistilBERT's init): a non-trivial student in a few KD steps.
    assert main(["distill", "--no-progress", "--method", "kd", "--teacher", str(teacher), "--student-init", "teacher",
                 "--student-layers", "1", "--unlabeled", "task", "--train-limit", "256", "--epochs", "1",
                 "--lr", "1e-4", "--out", str(student)]) == 0
    bench = load_benchmark("distill_table")
    # The teacher doubles as the no-teacher row (it was fine-tuned without one): a second
    # fine-tuning would double the test's cost and check nothing more.
    result = bench.main(["--smoke", "--cpu-time", "--teacher", str(teacher), "--student", f"tiny KD={student}",
                         "--student", f"no teacher={teacher}", "--baseline", "no teacher", "--out", str(out)])
    rows = {r["label"]: r for r in result["rows"]}
    assert list(rows) == ["teacher", "tiny KD", "no teacher"] and result["repeats"] == 1
    assert rows["teacher"]["share_of_teacher"] == 1.0 and rows["teacher"]["agreement_with_teacher"] == 1.0
    assert set(rows["teacher"]["predictions"]) == {0, 1}  # not a constant, majority-class model
    for label, run in (("teacher", teacher), ("tiny KD", student)):
        row = rows[label]
        assert row["accuracy"] == pytest.approx(json.loads((run / "results.json").read_text())["metrics"]["accuracy"],
                                                abs=1e-6)
        assert set(row["paths"]) == {"pytorch fp32", "pytorch int8", "onnx fp32", "onnx int8"}
        assert all(p["sentences_per_s"] > 0 for p in row["paths"].values())
        # ember's ONNX export is the same fp32 function, fed the same batches
        assert row["paths"]["onnx fp32"]["accuracy"] == row["paths"]["pytorch fp32"]["accuracy"]
        assert row["paths"]["onnx fp32"]["agreement_with_fp32"] == 1.0
    kd = rows["tiny KD"]
    assert kd["parameters"]["total"] < rows["teacher"]["parameters"]["total"]
    assert 0 < kd["parameters"]["backbone_without_embeddings"] < kd["parameters"]["total"]
    assert kd["share_of_teacher"] == pytest.approx(kd["accuracy"] / rows["teacher"]["accuracy"])
    assert kd["method"].startswith("kd")

    markdown = (out / "table.md").read_text()
    assert json.loads((out / "table.json").read_text())["rows"][1]["accuracy"] == kd["accuracy"]
    assert (out / "table.png").read_bytes()[:4] == b"\x89PNG"
    table, claims = markdown.split("## Claims")
    first_cells = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:]
    assert first_cells == ["**teacher**", "tiny KD", "no teacher (baseline)"]
    assert "tiny KD" in claims
    keeps = kd["share_of_teacher"] >= 0.97
    assert ("Holds for: tiny KD" in claims) == keeps and ("Does not hold for: tiny KD" in claims) == (not keeps)
    beats = kd["accuracy"] > rows["no teacher"]["accuracy"]
    assert f"tiny KD {'beats' if beats else 'does not beat'} no teacher (not the same model" in claims

    # A run whose results.json no longer matches its weights stops the table ...
    stale = tmp_path / "stale"
    shutil.copytree(student, stale)
    recorded = json.loads((stale / "results.json").read_text())
    recorded["metrics"]["accuracy"] += 0.01
    (stale / "results.json").write_text(json.dumps(recorded))
    with pytest.raises(EmberError, match="out of step"):
        bench.main(["--smoke", "--teacher", str(teacher), "--student", f"stale={stale}"])
    # ... and so does a run of another task.
    other = tmp_path / "cola"
    shutil.copytree(student, other)
    (other / "config.yaml").write_text((other / "config.yaml").read_text().replace("name: sst2", "name: cola"))
    with pytest.raises(EmberError, match="fine-tuned on CoLA"):
        bench.main(["--smoke", "--teacher", str(teacher), "--student", f"cola={other}"])


def test_distill_claims_follow_the_numbers():
    report = load_benchmark("_distill_report")
    gold = [0, 1] * 50

    def row(label, role, correct, layers=1, int8_points=0.0):
        preds = [y if i < correct else 1 - y for i, y in enumerate(gold)]
        acc = correct / len(gold)
        return {"label": label, "role": role, "accuracy": acc, "predictions": preds, "share_of_teacher": acc / 0.90,
                "shape": {"layers": layers}, "parameters": {"total": layers},
                "paths": {"pytorch fp32": {"accuracy": acc}, "pytorch int8": {"accuracy": acc + int8_points / 100}}}

    rows = [row("T", "teacher", 90, layers=4, int8_points=-0.6), row("A", "student", 88), row("B", "student", 87),
            row("C", "baseline", 85)]
    claims = report.claims({"rows": rows, "labels": gold})
    assert [(k["label"], k["keeps"]) for k in claims["keep"]] == [("A", True), ("B", False), ("C", False)]
    (a, b) = claims["beats"]
    assert (a["student"], a["baseline"], a["beats"], a["same_shape"]) == ("A", "C", True, True)
    assert (a["only_student_right"], a["only_baseline_right"]) == (3, 0)
    assert a["points"] == pytest.approx(3.0) and a["mcnemar_p"] == pytest.approx(2 / 8)
    assert [(p["label"], p["path"]) for p in claims["paths"] if not p["within"]] == [("T", "pytorch int8")]
    assert report.mcnemar_p(0, 0) == 1.0 and report.mcnemar_p(10, 0) == pytest.approx(2 / 1024)
    assert report.mcnemar_p(4, 9) == report.mcnemar_p(9, 4)
    # a student that loses to the baseline is reported as such
    rows[1] = row("A", "student", 80)
    assert not report.claims({"rows": rows, "labels": gold})["beats"][0]["beats"]


def test_xlm_zero_shot_smoke_fine_tunes_both_on_english_and_scores_russian_beside_the_baseline(tmp_path):
    from ember.errors import EmberError

    real_data("glue", "SST-2", "train.tsv")
    real_data("rusentiment", "rusentiment_test.csv")
    bench = load_benchmark("xlm_zero_shot")
    out = tmp_path / "zero-shot"
    result = bench.main(["--smoke", "--seeds", "1,2", "--out", str(out), "--no-progress"])
    assert [m["label"] for m in result["models"]] == ["XLM (en+ru)", "English-only"] and result["ran"] == 4
    # the majority class of the 794 binary test posts: 536 positive -> 67.5% accuracy, macro F1 0.403
    assert result["baseline"]["label"] == "positive" and result["baseline"]["accuracy"] == pytest.approx(536 / 794)
    assert result["baseline"]["f1_macro"] == pytest.approx((2 * (536 / 794) / (1 + 536 / 794)) / 2)
    for model in result["models"]:
        assert [r["seed"] for r in model["runs"]] == [1, 2]
        assert {r["target"]["task"] for r in model["runs"]} == {"RuSentiment pos/neg"}
        for name in ("sst2_accuracy", "ru_accuracy", "ru_f1_macro"):
            stat = model["summary"][name]
            assert 0.0 <= stat["mean"] <= 1.0 and stat["std"] is not None and len(stat["values"]) == 2
    markdown = (out / "results.md").read_text()
    assert "| majority class (always positive) | — | — | 67.5 | 40.3 |" in markdown and "## Reading" in markdown
    assert json.loads((out / "results.json").read_text())["models"][0]["summary"] == result["models"][0]["summary"]
    assert (out / "zero_shot.png").read_bytes()[:4] == b"\x89PNG"
    # Resumable: finished (model, seed) pairs are kept, a missing one is redone ...
    (out / "runs" / "english" / "seed-2" / "zero_shot.json").unlink()
    again = bench.main(["--smoke", "--seeds", "1,2", "--out", str(out), "--no-progress"])
    assert again["ran"] == 1 and again["models"][0]["summary"] == result["models"][0]["summary"]
    # ... and other settings in the same folder are refused.
    with pytest.raises(EmberError, match="other settings"):
        bench.main(["--smoke", "--seeds", "1", "--lr", "1e-4", "--out", str(out), "--no-progress"])
    # A missing --english run is refused before the XLM model is fine-tuned, not after.
    xlm = out / "smoke-models" / "xlm"
    with pytest.raises(EmberError, match="--english .*nowhere: not an ember pre-training run"):
        bench.main(["--xlm", str(xlm), "--english", str(tmp_path / "nowhere"), "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b" / "runs").exists()


@pytest.mark.slow
def test_knowledge_effect_smoke_fine_tunes_every_variant_on_both_tasks_and_resumes(tmp_path):
    for parts in (("checkpoints", "all-MiniLM-L6-v2", "config.json"), ("glue", "SST-2", "dev.tsv"),
                  ("conll2003", "dev.txt")):
        real_data(*parts)
    bench = load_benchmark("knowledge_effect")
    argv = ["--out", str(tmp_path), "--smoke", "--cpu-time"]
    result = bench.main(argv)
    table = result["table"]
    assert set(table) == {"sst2", "conll2003"} and all(set(splits) == {"dev", "test"} for splits in table.values())
    for splits in table.values():
        for row in splits.values():
            assert set(row) == {"baseline", "kbert", "ernie"}
            assert all(0.0 <= r["mean"] <= 1.0 for r in row.values())
            assert "vs_reference" in row["kbert"] and "vs_reference" in row["ernie"]
    assert "sentences with knowledge" in result["knowledge"]["sst2/kbert"]
    assert "aligned entities" in result["knowledge"]["conll2003/ernie"]
    assert (tmp_path / "table.md").read_text().count("| sst2 |") == 2 and (tmp_path / "knowledge_effect.png").is_file()
    assert bench.main(argv)["records"] == result["records"]  # a second call resumes: nothing is trained again


def test_features_vs_finetune_smoke_runs_every_layer_choice_on_conll_and_resumes(tmp_path):
    real_data("conll2003", "train.txt")
    bench = load_benchmark("features_vs_finetune")
    argv = ["--out", str(tmp_path), "--smoke", "--variants", "finetune,embeddings,concat-last-4,mix"]
    result = bench.main(argv)
    for split in ("dev", "test"):
        row = result["table"]["conll2003"][split]
        assert set(row) == {"finetune", "embeddings", "concat-last-4", "mix"}
        assert "vs_reference" in row["mix"] and "vs_reference" not in row["finetune"]
    mix = next(r for r in result["records"] if r["variant"] == "mix")
    assert len(mix["layer_weights"]) == 5 and abs(sum(mix["layer_weights"]) - 1) < 1e-6  # 4 layers + embeddings
    assert "| conll2003 | test |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "features_vs_finetune.png").read_bytes()[:4] == b"\x89PNG"
    assert bench.main(argv)["records"] == result["records"]  # a second call trains nothing again


@pytest.mark.slow
def test_dai_le_nsmc_smoke_pretrains_both_lstms_fine_tunes_three_ways_and_resumes(tmp_path):
    real_data("nsmc", "unlabeled.txt.gz")
    bench = load_benchmark("dai_le_nsmc")
    out = tmp_path / "dai-le"
    result = bench.main(["--smoke", "--out", str(out)])
    assert set(result["finetune"]) == {"random", "lm", "sa"}
    for label, by_n in result["finetune"].items():
        assert set(by_n) == {"200", "400"} and all(len(runs) == 1 for runs in by_n.values())
        assert all(0.0 <= r["other_splits"]["test"]["accuracy"] <= 1.0 for runs in by_n.values() for r in runs)
    assert result["finetune"]["lm"]["200"][0]["train_examples"] == 200
    bow = result["bag_of_words"]
    assert bow["test_examples"] == 400 and bow["by_labels"]["400"]["test_accuracy"] > 0.55  # learns on 400 reviews
    for name, curve in result["pretraining"].items():  # held-out perplexity falls on real reviews
        assert curve["ppl"][-1] < curve["ppl"][0], name
    table = (out / "results.md").read_text()
    assert "| labels | bag of words (LR) | LSTM, random init | LM-LSTM | SA-LSTM |" in table
    # one seed has no spread: no claim either way (a zero std once let any gain "hold")
    assert table.count("one seed: no spread, no claim") == 4 and ": holds" not in table
    for png in ("accuracy_vs_labels.png", "perplexity.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    # A second call finds every stage done: nothing is trained again, the same numbers come back.
    curve = (out / "pretrain-lm" / "metrics.jsonl").read_text()
    again = bench.main(["--smoke", "--out", str(out)])
    assert again["finetune"] == result["finetune"] and again["bag_of_words"] == result["bag_of_words"]
    assert (out / "pretrain-lm" / "metrics.jsonl").read_text() == curve


@pytest.mark.slow
def test_dai_le_sst2_smoke_pretrains_on_sst2_sentences_and_scores_the_held_out_dev_half(tmp_path):
    real_data("glue", "SST-2", "train.tsv")
    bench = load_benchmark("dai_le_nsmc")
    out = tmp_path / "dai-le-sst2"
    result = bench.main(["--smoke", "--task", "sst2", "--objectives", "lm", "--out", str(out)])
    select, held_out = (out / "data" / "sst2-dev-select.tsv", out / "data" / "sst2-dev-test.tsv")
    n_select, n_held = (len(p.read_text().splitlines()) - 1 for p in (select, held_out))
    assert n_select + n_held == 872 and min(n_select, n_held) > 380  # dev split in two halves
    assert len((out / "data" / "sst2-train-sentences.txt").read_text().splitlines()) == 67349
    assert set(result["finetune"]) == {"random", "lm"}
    for by_n in result["finetune"].values():  # every run scored once on the held-out half
        assert all(0.0 <= runs[0]["other_splits"]["test"]["accuracy"] <= 1.0 for runs in by_n.values())
    assert result["bag_of_words"]["test_examples"] == n_held
    assert result["bag_of_words"]["by_labels"]["400"]["test_accuracy"] > 0.55  # SST-2 words carry sentiment
    assert result["pretraining"]["lm"]["ppl"][-1] < result["pretraining"]["lm"]["ppl"][0]
    assert "# Dai & Le 2015 on SST-2" in (out / "results.md").read_text()
    assert bench.main(["--smoke", "--task", "sst2", "--objectives", "lm", "--out", str(out)])["finetune"] == result["finetune"]


def test_bag_of_words_logistic_regression_matches_scikit_learn():
    """Two-class softmax with l2 on both columns == binary logistic regression with C = 2 / (l2 n)."""
    sklearn = pytest.importorskip("sklearn.linear_model")
    import numpy as np

    bow = load_benchmark("_bow")
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(0, 30, rng.integers(1, 12))) for _ in range(200)]
    y = np.array([int(sum(t < 10 for t in d) > len(d) / 3) for d in docs])
    x = bow.token_counts(docs, 30)
    dense = np.zeros((200, 30))
    np.add.at(dense, (x.rows, x.tokens), x.counts)
    assert dense.sum() == sum(len(d) for d in docs)
    mine = bow.LogisticRegression(2, l2=1e-2, steps=3000).fit(x, y)
    reference = sklearn.LogisticRegression(C=2 / (1e-2 * 200), tol=1e-10, max_iter=10000).fit(dense, y)
    np.testing.assert_allclose(mine.predict_proba(x)[:, 1], reference.predict_proba(dense)[:, 1], atol=1e-4)


@pytest.mark.slow
def test_distributed_scaling_smoke_reports_rates_memory_and_projection(wiki_prepared, tmp_path):
    bench = load_benchmark("distributed_scaling")
    result = bench.main(["--smoke", "--data", str(wiki_prepared), "--json", str(tmp_path / "r.json")])
    assert set(result["throughput"]) == {"1 process", "2 ranks DDP", "2 ranks FSDP"}
    assert all(v > 0 for v in result["throughput"].values())
    ddp, fsdp = result["memory"]["bert-tiny"]["ddp"], result["memory"]["bert-tiny"]["fsdp"]
    assert ddp["params"] == 4 * ddp["num_parameters"]  # a full fp32 replica per rank
    assert fsdp["params"] < 0.6 * ddp["params"] and fsdp["optimizer"] < 0.6 * ddp["optimizer"]  # about half
    (row,) = [r for r in result["projection"]["bert-tiny"] if r["nodes"] == 1 and r["dtype"] == "fp32"]
    assert row["fsdp_bytes"] == 1.5 * row["ddp_bytes"] == 3 * 7 / 8 * 4 * ddp["num_parameters"]
    state = result["state_per_rank"]["bert-tiny"]
    assert state["DDP (any W)"] == 16 * ddp["num_parameters"] == 8 * state["FSDP W=8"]
    with pytest.raises(SystemExit):  # two warm-up steps leave nothing to time: refused, not a StatisticsError
        bench.main(["--data", str(wiki_prepared), "--steps", "2"])


def test_sense_rule_labels_by_context_cues_and_drops_both_neither_and_proper_names():
    data = load_benchmark("_sense_data")
    rules = data.rule("bank")
    assert data.label("They walked along the bank of the river at dawn.", "bank", rules) == ("river", "labelled")
    assert data.label("The bank raised its interest rate on loans.", "bank", rules) == ("finance", "labelled")
    assert data.label("The bank lent money to build a bridge over the river.", "bank", rules)[1] == "both senses"
    assert data.label("She sat on the bank and read.", "bank", rules) == (None, "no cue")
    assert data.label("Settlements in the West Bank draw water from the aquifer.", "bank", rules)[1] == \
        "excluded phrase"
    # capitalised exclusions are proper names: the west bank of a river is still a river bank
    assert data.label("Luxor lies on the west bank of the Nile river.", "bank", rules)[0] == "river"
    # mid-sentence "Bank" is part of a name (a lender or a sandbank alike): dropped whatever the cues
    assert data.label("Loans of the World Bank paid for water pipes.", "bank", rules, named=True) == \
        (None, "capitalised name")
    groups = {"a": [data.Occurrence(f"a{i}", 0, 1, "a", "") for i in range(9)],
              "b": [data.Occurrence(f"b{i}", 0, 1, "b", "") for i in range(4)]}
    sample = data.balanced_sample(groups, 6, seed=3)
    assert sorted(o.sense for o in sample) == ["a"] * 4 + ["b"] * 4  # balanced at the smaller sense's size
    assert sample == data.balanced_sample(groups, 6, seed=3) != data.balanced_sample(groups, 6, seed=4)


def test_word_senses_nearest_neighbour_counts_ties_as_a_random_pick():
    import numpy as np

    bench = load_benchmark("word_senses")
    y = np.array([0, 0, 0, 1, 1, 1])
    same = np.ones((6, 4))  # one vector for every occurrence: leave-one-out chance (m - 1) / (2m - 1)
    assert bench.nn_accuracy(same, y) == pytest.approx(2 / 5)
    apart = np.array([[1, 0.1 * i, 0, 0] for i in range(3)] + [[0, 0, 1, 0.1 * i] for i in range(3)])
    assert bench.nn_accuracy(apart, y) == 1.0 and bench.kmeans_purity(apart, y, 0) == 1.0
    assert bench.silhouette(apart, y) > 0.5 and bench.silhouette(same, y) == 0.0


def test_word_senses_smoke_labels_real_wikipedia_and_measures_every_layer(tmp_path):
    pytest.importorskip("transformers")
    real_data("wiki-en", "AA", "wiki_00.gz")
    bench = load_benchmark("word_senses")
    result = bench.main(["--smoke", "--seeds", "1,2,3", "--out", str(tmp_path)])
    assert set(result["labelled"]) == {"river", "finance"} and all(n > 0 for n in result["labelled"].values())
    m = result["per_sense"]
    assert list(result["summary"]) == ["static", "bag of words", "bag of words, cues removed", "layer 0", "layer 1",
                                      "layer 2"]
    assert result["summary"]["static"]["nn_accuracy"]["values"] == [pytest.approx((m - 1) / (2 * m - 1))] * 3
    for stats in result["summary"].values():
        assert 0.5 <= stats["kmeans_purity"]["mean"] <= 1.0 and -1.0 <= stats["silhouette"]["mean"] <= 1.0
    markdown = (tmp_path / "results.md").read_text()
    assert "## Labelling rule" in markdown and "**river** cues:" in markdown and "## Reading" in markdown
    assert json.loads((tmp_path / "results.json").read_text())["summary"] == result["summary"]
    assert (tmp_path / "senses.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_word_senses_minilm_layers_tell_bank_senses_apart_on_real_wikipedia(tmp_path, monkeypatch):
    real_data("checkpoints", "all-MiniLM-L6-v2", "model.safetensors")
    real_data("wiki-en", "AB")
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "cache"))
    bench = load_benchmark("word_senses")
    result = bench.main(["--max-files", "60", "--per-sense", "40", "--seeds", "1,2,3", "--out", str(tmp_path / "out")])
    assert result["labelled"]["river"] >= 40 and result["labelled"]["finance"] >= 40  # the rule finds both senses
    s = result["summary"]
    chance = s["static"]["nn_accuracy"]
    assert chance["std"] == 0.0 and chance["mean"] == pytest.approx(39 / 79)  # one vector: at chance
    best = s[result["best_layer"]]["nn_accuracy"]
    assert result["best_layer"] != "layer 0" and best["mean"] - 2 * best["std"] > chance["mean"]


def test_qa_batch_order_smoke_counts_paragraphs_per_batch_of_real_squad_windows(tmp_path):
    real_data("squad2-dev-half")
    real_data("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json")
    bench = load_benchmark("qa_batch_order")
    out = tmp_path / "rows.json"
    rows = bench.main(["--smoke", "--batch-size", "8", "--seeds", "1", "--json", str(out)])
    by = {r["order"]: r for r in rows}
    assert set(by) == {"shuffled", "length-grouped", "length-grouped-spread"}
    # the default keeps paragraphs apart as random batches do, and pads about as little as the plain sort
    assert by["length-grouped-spread"]["paragraphs_per_batch"] > by["length-grouped"]["paragraphs_per_batch"]
    assert by["length-grouped-spread"]["padded_over_real_tokens"] < by["shuffled"]["padded_over_real_tokens"]
    assert json.loads(out.read_text()) == rows
