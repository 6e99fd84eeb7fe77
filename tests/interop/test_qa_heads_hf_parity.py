"""Fine-tuned extractive-QA checkpoints (transformers' ``…ForQuestionAnswering``) in and out of
ember, for every encoder family whose QA head is BERT's Linear(H, 2): start/end logits equal to
transformers' on padded batches both ways (tiny random models built locally, weights perturbed),
a Longformer's question under global attention by transformers' own rule, and the real
all-MiniLM-L6-v2 encoder with a QA head answering real SQuAD questions as transformers scores them."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import real_data  # noqa: E402
from hf_interop_helpers import ATOL, assert_close_where, load_all_but_pooler, load_hf, perturb, write_hf_folder  # noqa: E402

from ember.cli import main  # noqa: E402
from ember.interop.families import export_state, import_checkpoint, interop_for_hf_config  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.tasks.qa.head import QuestionAnswering  # noqa: E402

VOCAB, PAD = 98, 1
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=66, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=PAD)
CONFIGS = {
    "bert": lambda: transformers.BertConfig(**SIZES),
    "roberta": lambda: transformers.RobertaConfig(**SIZES, type_vocab_size=1, layer_norm_eps=1e-5),
    "albert": lambda: transformers.AlbertConfig(**SIZES, embedding_size=16),
    "electra": lambda: transformers.ElectraConfig(**SIZES, embedding_size=16),
    "distilbert": lambda: transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                                        max_position_embeddings=66, dropout=0.0, attention_dropout=0.0,
                                                        pad_token_id=PAD),
    "longformer": lambda: transformers.LongformerConfig(**SIZES, type_vocab_size=1, layer_norm_eps=1e-5,
                                                        attention_window=[4, 6], sep_token_id=2, bos_token_id=0),
}
CLASSES = {"bert": "BertForQuestionAnswering", "roberta": "RobertaForQuestionAnswering",
           "albert": "AlbertForQuestionAnswering", "electra": "ElectraForQuestionAnswering",
           "distilbert": "DistilBertForQuestionAnswering", "longformer": "LongformerForQuestionAnswering"}


def qa_batch(length: int = 19, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``<s> question </s></s> context </s>`` rows (ids 0 / 2 as RoBERTa's; Longformer's QA head
    insists on exactly three separators per row), questions of 3, 5 and 2 tokens, row 1 padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (3, length), generator=g)
    mask = torch.ones(3, length, dtype=torch.long)
    for row, (question, end) in enumerate(((3, length), (5, 13), (2, length))):
        ids[row, 0] = 0
        ids[row, question + 1:question + 3] = 2
        ids[row, end - 1] = 2
        ids[row, end:] = PAD
        mask[row, end:] = 0
    return ids, mask


def hf_logits(hf, ids, mask, family):
    kwargs = {} if family in ("distilbert", "roberta", "longformer") else {"token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, **kwargs)
    return out.start_logits, out.end_logits


def ember_qa(cfg, state) -> QuestionAnswering:
    module = QuestionAnswering(build_backbone(cfg), PAD)
    return load_all_but_pooler(module, state).eval()


@pytest.mark.parametrize("family", list(CONFIGS))
def test_encoder_qa_head_hf_parity_both_ways(family):
    hf = perturb(getattr(transformers, CLASSES[family])(CONFIGS[family]()), seed=3, scale=0.1)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    assert {k for k in state if not k.startswith("backbone.")} == {"qa_outputs.weight", "qa_outputs.bias"}
    ours = ember_qa(cfg, state)
    ids, mask = qa_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        start, end = ours.logits(batch)
    ref_start, ref_end = hf_logits(hf, ids, mask, family)
    assert ref_start.abs().max() > 0.1  # a real signal, not a near-zero head
    assert_close_where(start, ref_start, mask)
    assert_close_where(end, ref_end, mask)
    # and out again: transformers' class, names and tensors
    arch, back = export_state(interop_for_hf_config(hf.config.to_dict()), ours.state_dict(), cfg)
    assert arch == CLASSES[family]
    expected = {k: v for k, v in hf.state_dict().items() if not k.endswith(("position_ids", "token_type_ids"))}
    assert set(back) == set(expected)
    for name, tensor in back.items():
        if name.endswith("position_embeddings.weight") and family in ("roberta", "longformer"):
            # rows 0..pad are never read (RoBERTa numbers positions from pad + 1): export writes zeros
            tensor, expected[name] = tensor[PAD + 1:], expected[name][PAD + 1:]
        torch.testing.assert_close(tensor, expected[name], atol=0, rtol=0)


def test_longformer_qa_puts_the_question_under_global_attention():
    """Without its global question the Longformer's answer logits differ from transformers' (the
    rule matters here), and with a separator recorded they agree."""
    hf = perturb(transformers.LongformerForQuestionAnswering(CONFIGS["longformer"]()), seed=5, scale=0.1)
    cfg, state = import_checkpoint(hf.config.to_dict(), hf.state_dict())
    assert cfg.sep_token_id == 2
    ids, mask = qa_batch(length=23)  # transformers pads to 24, a multiple of both windows (4, 6)
    ours = ember_qa(cfg, state)
    glob = ours.backbone_inputs(ids)["global_attention_mask"]
    assert glob[0].nonzero().flatten().tolist() == [0, 1, 2, 3]  # <s> and the 3-token question, not </s>
    ref_start, _ = hf_logits(hf, ids, mask, "longformer")
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    no_sep = ember_qa(cfg.__class__(**{**cfg.__dict__, "sep_token_id": -1}), state)
    with torch.no_grad():
        local_only, _ = no_sep.logits(batch)
        start, _ = ours.logits(batch)
    assert (local_only - ref_start)[mask.bool()].abs().max() > 1e-3
    assert_close_where(start, ref_start, mask)
    # the served model (ember serve's /answer, the ONNX export) reads the same globals
    from ember.serve.graph import InferenceGraph

    with torch.no_grad():
        served, _ = InferenceGraph(ours)(ids, mask, torch.zeros_like(ids), need_hidden=False)
    assert_close_where(served[:, 0], ref_start, mask)


def test_bigbird_qa_head_is_refused_with_its_reason(tmp_path, capsys):
    config = transformers.BigBirdConfig(**SIZES, attention_type="original_full")
    hf = perturb(transformers.BigBirdForQuestionAnswering(config), seed=0)
    folder = write_hf_folder(hf.state_dict(), {**config.to_dict(), "architectures": ["BigBirdForQuestionAnswering"]},
                             tmp_path / "hf")
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "run")]) != 0
    assert "'BigBirdForQuestionAnswering' cannot be imported" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_bert_qa_checkpoint_imports_as_squad_run_and_exports_back(tmp_path, tiny_tokenizer_path):
    from ember.runs.folder import load_run_config
    from ember.tokenizers import load_tokenizer

    vocab = load_tokenizer(tiny_tokenizer_path).get_vocab_size()
    config = transformers.BertConfig(**{**SIZES, "vocab_size": vocab, "pad_token_id": 0})
    hf = perturb(transformers.BertForQuestionAnswering(config), seed=2, scale=0.1)
    folder = write_hf_folder(hf.state_dict(), {**config.to_dict(), "architectures": ["BertForQuestionAnswering"]},
                             tmp_path / "hf")
    (folder / "tokenizer.json").write_bytes(tiny_tokenizer_path.read_bytes())
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "run")]) == 0
    cfg = load_run_config(tmp_path / "run")
    assert (cfg.kind, cfg.task.name, cfg.task.max_length, cfg.model.pooler) == ("finetune", "squad2", 66, False)
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    back = load_hf(transformers.BertForQuestionAnswering, tmp_path / "back")
    ids, mask = qa_batch()
    ids = ids % vocab
    a, b = hf_logits(hf, ids, mask, "bert"), hf_logits(back, ids, mask, "bert")
    torch.testing.assert_close(a, b, atol=0, rtol=0)  # the same weights, the same computation


def test_minilm_qa_answers_real_squad_questions_as_transformers_scores_them(tmp_path):
    """The real encoder with a seeded QA head, saved by transformers and imported: `ember predict`
    on real SQuAD 2.0 questions gives, per question, the span whose logits transformers rates best
    among ember's candidates, and ember's logits equal transformers' on the same windows."""
    checkpoint = real_data("checkpoints", "all-MiniLM-L6-v2")
    squad = real_data("squad2-dev-half", "dev-v2.0.json")
    torch.manual_seed(0)
    hf = transformers.BertForQuestionAnswering.from_pretrained(checkpoint).eval()  # local folder; the head is new
    hf.save_pretrained(tmp_path / "hf")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (checkpoint / name).is_file():
            (tmp_path / "hf" / name).write_bytes((checkpoint / name).read_bytes())
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0

    data = json.loads(squad.read_text())
    article = data["data"][0]
    small = {"version": "v2.0", "data": [{"title": article["title"], "paragraphs": article["paragraphs"][:1]}]}
    (tmp_path / "q.json").write_text(json.dumps(small))
    assert main(["predict", str(tmp_path / "run"), "--input", str(tmp_path / "q.json"),
                 "--out", str(tmp_path / "answers.jsonl"), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    paragraph = small["data"][0]["paragraphs"][0]
    assert [r["id"] for r in rows] == [q["id"] for q in paragraph["qas"]]

    from ember.runs.folder import load_run_config
    from ember.tasks.base import get_adapter
    from ember.tasks.qa.head import decode_answers
    from ember.tasks.qa.squad import read_squad
    from ember.tasks.task_model import load_task_module
    from ember.tokenizers import load_tokenizer

    cfg = load_run_config(tmp_path / "run")
    adapter = get_adapter(cfg.task.name)
    examples, features = adapter.load("dev", load_tokenizer(tmp_path / "run" / "tokenizer.json"), cfg.task.max_length,
                                      path=str(tmp_path / "q.json"))
    ours = load_task_module(tmp_path / "run", cfg, adapter, 0).predict(features)
    theirs = []
    for f in features:
        ids = torch.tensor([f["input_ids"]])
        with torch.no_grad():
            out = hf(input_ids=ids, token_type_ids=torch.tensor([f["token_type_ids"]]))
        theirs.append((out.start_logits[0].numpy(), out.end_logits[0].numpy()))
    for (s, e), (hs, he) in zip(ours, theirs):
        torch.testing.assert_close(torch.from_numpy(s), torch.from_numpy(hs), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.from_numpy(e), torch.from_numpy(he), atol=1e-4, rtol=0)
    answers = decode_answers([ex.context for ex in examples], features, theirs)
    assert [r["best_span"] for r in rows] == [a.text for a in answers]
    assert all(r["best_span"] in paragraph["context"] for r in rows) and len(rows) >= 3
    assert read_squad(tmp_path / "q.json")[0].context == paragraph["context"]
