"""`ember embed` and `ember evaluate --zero-shot`: vectors in the input's order for .txt/.jsonl/.tsv,
equal to /embed's; option overrides; every backend; bad input files -> file:line errors and
nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import real_data
from hf_interop_helpers import perturb

from ember.cli import main as ember_main
from ember.tasks.inference.requests import Limits

WORDS = ["the w1 w2 a w3s", "w4 w5 w6 w7 w8 the w9 w10 w11", "a w12", "w13 w14 the", "w20 w21 w22 w23 w24 w25"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    from ember.interop.convert import import_hf

    return import_hf(real_data("checkpoints", "all-MiniLM-L6-v2"), tmp_path_factory.mktemp("minilm") / "run")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny random BERT imported from an HF folder (mean pooling, no embedding.json)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from conftest import make_wordpiece
    from ember.interop.convert import import_hf

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=98, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64))
    perturb(model, scale=0.5)  # texts far apart: cosines that are not all ~1
    model.save_pretrained(root / "hf")
    make_wordpiece([f"w{i}" for i in range(90)] + ["the", "a", "##s"]).save(str(root / "hf" / "tokenizer.json"))
    return import_hf(root / "hf", root / "run")


def one_by_one(run, texts, max_length=None, **options):
    """Each text alone through the predictor's embed method: what /embed answers."""
    from ember.serve.predictor import load_predictor

    predictor = load_predictor(run, max_length=max_length)
    method = predictor.methods["embed"]
    return np.array([predictor.run("embed", [method.parse({"text": t, **options}, Limits())])[0]["results"][0]["embedding"]
                     for t in texts], dtype=np.float32)


def test_embed_cli_keeps_the_order_of_txt_jsonl_tsv_and_csv_inputs_on_real_sentences(minilm, tmp_path, capsys):
    import csv

    sst2 = real_data("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[:41]
    (tmp_path / "dev.tsv").write_text("\n".join(sst2) + "\n", encoding="utf-8")  # header: sentence, label
    texts = [line.split("\t")[0] for line in sst2[1:]]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"id": i, "review": t}) + "\n"
                                                  for i, t in enumerate(texts)), encoding="utf-8")
    with open(tmp_path / "texts.csv", "w", newline="", encoding="utf-8") as fh:  # quoted fields: commas in texts
        csv.writer(fh).writerows([("id", "review"), *((i, t) for i, t in enumerate(texts))])
    assert any("," in t for t in texts)
    outputs = {}
    for name, extra in (("texts.txt", []), ("texts.jsonl", ["--column", "review"]), ("dev.tsv", []),
                        ("texts.csv", ["--column", "review"])):
        out = tmp_path / f"{name}.npy"
        assert ember_main(["embed", str(minilm), "--input", str(tmp_path / name), "--out", str(out),
                           "--batch-size", "8", "--no-progress", *extra]) == 0
        outputs[name] = np.load(out)
    assert "wrote 40 x 384 vectors" in capsys.readouterr().out
    np.testing.assert_array_equal(outputs["texts.txt"], outputs["texts.jsonl"])
    np.testing.assert_array_equal(outputs["texts.txt"], outputs["dev.tsv"])
    np.testing.assert_array_equal(outputs["texts.txt"], outputs["texts.csv"])  # the header is not a text
    vectors = outputs["texts.txt"]
    assert vectors.shape == (40, 384) and vectors.dtype == np.float32
    # Sorted, batched, padded: still each text's own vector, the one /embed gives it alone.
    np.testing.assert_allclose(vectors, one_by_one(minilm, texts), atol=1e-5, rtol=0)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(1.0, abs=1e-5)  # the checkpoint's Normalize


def test_embed_options_override_the_run_defaults(tiny_run, tmp_path):
    import ember

    (tmp_path / "in.txt").write_text("\n".join(WORDS) + "\n")
    out = tmp_path / "v.npy"
    assert ember_main(["embed", str(tiny_run), "--input", str(tmp_path / "in.txt"), "--out", str(out), "--pooling", "cls",
                       "--layer", "1", "--normalize", "--max-length", "8", "--no-progress"]) == 0
    expected = one_by_one(tiny_run, WORDS, max_length=8, pooling="cls", layer=1, normalize=True)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-5, rtol=0)
    default = ember.embed(tiny_run, WORDS)
    np.testing.assert_allclose(default, one_by_one(tiny_run, WORDS), atol=1e-5, rtol=0)
    assert not np.allclose(np.linalg.norm(default, axis=1), 1.0)  # mean, unnormalised: the run has no embedding.json
    one = ember.embed(tiny_run, WORDS[1])  # a str is one text (its vector), not a list of its characters
    assert one.shape == default[1].shape and np.allclose(one, default[1], atol=1e-6)
    short = ember.embed(tiny_run, WORDS, max_length=8)
    assert not np.allclose(short[1], default[1]) and np.allclose(short[2], default[2], atol=1e-6)  # only long texts cut


def test_embed_backends_agree(tiny_run):
    pytest.importorskip("onnxruntime")
    import ember

    fp32 = ember.embed(tiny_run, WORDS)
    np.testing.assert_allclose(ember.embed(tiny_run, WORDS, backend="onnx"), fp32, atol=1e-4, rtol=0)
    for backend in ("int8", "bf16", "onnx-int8"):  # lossy (and these weights are large): close in direction only
        got = ember.embed(tiny_run, WORDS, backend=backend)
        cos = (got * fp32).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(fp32, axis=1)
        assert cos.min() > 0.97, (backend, cos)


def test_embed_cli_bf16_flag_runs_the_bf16_backend(tiny_run, tmp_path, capsys):
    from ember.train.precision import cpu_has_fast_bf16

    (tmp_path / "in.txt").write_text("\n".join(WORDS) + "\n")
    out = tmp_path / "v.npy"
    assert ember_main(["embed", str(tiny_run), "--input", str(tmp_path / "in.txt"), "--out", str(out), "--bf16",
                       "--no-progress"]) == 0
    import ember

    fp32, bf16 = ember.embed(tiny_run, WORDS), np.load(out)
    np.testing.assert_allclose(bf16, ember.embed(tiny_run, WORDS, backend="bf16"), atol=0, rtol=0)
    assert not np.array_equal(bf16, fp32)  # not the fp32 numbers
    assert ("without AMX" in capsys.readouterr().err) == (not cpu_has_fast_bf16())  # the slow-CPU warning


BAD_INPUTS = [
    ("empty.txt", "", [], "empty.txt:1: the file is empty"),
    ("blank.txt", "one\n\nthree\n", [], "blank.txt:2: blank line"),
    ("rows.jsonl", '{"text": "a"}\n{"txt": "b"}\n', [], "rows.jsonl:2: no 'text' key (keys: txt)"),
    ("bad.jsonl", '{"text": "a"}\n{"text": "b"\n', [], "bad.jsonl:2: not valid JSON"),
    ("list.jsonl", '["a"]\n', [], "list.jsonl:1: expected a JSON object"),
    ("empty-text.jsonl", '{"text": ""}\n', [], "empty-text.jsonl:1: 'text' must be a non-empty string"),
    ("cols.tsv", "id\tlabel\n1\t0\n", [], "cols.tsv:1: no 'text' or 'sentence' column"),
    ("cols2.tsv", "id\tbody\n1\tfine\n", ["--column", "review"], "cols2.tsv:1: no 'review' column"),
    ("ragged.tsv", "text\tlabel\nfine\t1\nbad\n", [], "ragged.tsv:3: 1 tab-separated fields, the header has 2"),
    ("header.tsv", "text\n", [], "header.tsv:2: no rows after the header"),
    ("cols.csv", "id,label\n1,0\n", [], "cols.csv:1: no 'text' or 'sentence' column"),
    ("ragged.csv", "text,label\nfine,1\nbad\n", [], "ragged.csv:3: expected 2 comma-separated fields"),
    ("plain.txt", "fine\n", ["--column", "text"], "--column 'text' applies to .jsonl, .tsv and .csv"),
    ("latin1.txt", b"caf\xe9\n", [], "latin1.txt:1: not valid UTF-8"),
]


@pytest.mark.parametrize("name,content,extra,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_embed_bad_input_files_name_file_and_line_and_write_nothing(tiny_run, tmp_path, capsys, name, content, extra,
                                                                  message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "v.npy"
    assert ember_main(["embed", str(tiny_run), "--input", str(path), "--out", str(out), "--no-progress", *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.startswith("ember embed: error:"), err
    assert not out.exists()


def test_embed_refuses_what_it_cannot_write(tiny_run, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("fine\n")
    assert ember_main(["embed", str(tiny_run), "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.csv")]) == 1
    assert "write the vectors to a .npy file" in capsys.readouterr().err
    import ember
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="pooling 'none' gives one vector per token"):
        ember.embed(tiny_run, WORDS, pooling="none")
    with pytest.raises(EmberError, match="pooling 'max': sentence vectors are pooled by mean or cls"):
        ember.embed(tiny_run, WORDS, pooling="max")
    with pytest.raises(EmberError, match=r"'texts\[1\]' is not valid Unicode"):
        ember.embed(tiny_run, ["fine", "\ud800"])


def test_evaluate_zero_shot_on_a_pair_file_and_its_refusals(tiny_run, tmp_path, capsys):
    import ember
    from ember.tasks.metrics.classification import pearson, spearman

    pairs = [(WORDS[0], WORDS[1], 1.0), (WORDS[2], WORDS[3], 4.5), (WORDS[4], WORDS[0], 2.0), (WORDS[1], WORDS[3], 3.0)]
    (tmp_path / "pairs.tsv").write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs))
    assert ember_main(["evaluate", str(tiny_run), "--zero-shot", "--file", str(tmp_path / "pairs.tsv"),
                       "--pooling", "cls"]) == 0
    result = json.loads(capsys.readouterr().out)
    a = ember.embed(tiny_run, [p[0] for p in pairs], pooling="cls", normalize=True)
    b = ember.embed(tiny_run, [p[1] for p in pairs], pooling="cls", normalize=True)
    cos, gold = (a * b).sum(1), [p[2] for p in pairs]
    assert result["task"] == "sentence pairs" and result["pooling"] == "cls" and result["zero_shot"] is True
    assert result["metrics"]["pearson_cosine"] == pytest.approx(100 * pearson(cos, gold), abs=1e-3)
    assert result["metrics"]["spearman_cosine"] == pytest.approx(100 * spearman(cos, gold), abs=1e-3)
    for args, message in ((["--zero-shot", "--task", "sst2"], "SST-2 has class labels"),
                          (["--pooling", "cls"], "only with zero_shot=True (--zero-shot)"),
                          (["--zero-shot", "--task", "pairs"], "give the pairs with --file PATH"),
                          (["--task", "stsb"], "ember evaluate " + str(tiny_run) + " --zero-shot")):
        assert ember_main(["evaluate", str(tiny_run), *args]) == 1
        assert message in capsys.readouterr().err
    (tmp_path / "one.tsv").write_text("sentence1\tsentence2\tscore\na fine film\ta good film\t4.0\n")
    assert ember_main(["evaluate", str(tiny_run), "--zero-shot", "--file", str(tmp_path / "one.tsv")]) == 1
    assert "a correlation needs at least two pairs" in capsys.readouterr().err  # was a ValueError traceback


def test_embed_refuses_a_run_without_hidden_states(tmp_path, capsys):
    """A GPT run serves /generate only: `ember embed` says so instead of failing inside."""
    pytest.importorskip("transformers")
    from gpt_helpers import make_gpt_run

    run = make_gpt_run(tmp_path)
    (tmp_path / "in.txt").write_text("fine\n")
    assert ember_main(["embed", str(run), "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy")]) == 1
    assert "no hidden states to embed with" in capsys.readouterr().err
