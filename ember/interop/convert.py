"""`ember convert`: HF checkpoint folder <-> ember run folder (BERT family today).

Import reads ``config.json`` + ``model.safetensors``/``pytorch_model.bin`` (+ ``tokenizer.json``
or ``vocab.txt``) and writes an ember run folder usable by ``ember finetune --init``.
Export writes the HF layout: ``config.json``, ``model.safetensors`` (HF names),
``tokenizer.json``, ``vocab.txt`` (WordPiece) and ``tokenizer_config.json``, loadable with
``transformers``' ``from_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.config import RunConfig
from ember.errors import EmberError
from ember.interop import hf_bert
from ember.interop.common import read_hf_config, read_hf_weights
from ember.train.checkpoint import atomic_write_text, load_weights, save_weights
from ember.train.rundir import check_family, load_run_config, write_run_files


def _tokenizer_from_hf(hf_dir: Path, out_path: Path) -> None:
    if (hf_dir / "tokenizer.json").is_file():
        out_path.write_bytes((hf_dir / "tokenizer.json").read_bytes())
        return
    vocab = hf_dir / "vocab.txt"
    if not vocab.is_file():
        raise EmberError(f"{hf_dir} has neither tokenizer.json nor vocab.txt")
    from tokenizers.implementations import BertWordPieceTokenizer

    lowercase = True
    tok_cfg = hf_dir / "tokenizer_config.json"
    if tok_cfg.is_file():
        lowercase = json.loads(tok_cfg.read_text()).get("do_lower_case", True)
    BertWordPieceTokenizer(str(vocab), lowercase=lowercase).save(str(out_path))


def import_hf(hf_dir: str | Path, out_dir: str | Path) -> Path:
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    model_cfg = hf_bert.config_from_hf(read_hf_config(hf_dir))
    state = hf_bert.state_from_hf(read_hf_weights(hf_dir), model_cfg)
    objective = "bert" if any(k.startswith("nsp.") for k in state) else "mlm"
    kind = "finetune" if any(k.startswith("classifier.") for k in state) else "pretrain"
    cfg = RunConfig(kind=kind, objective=objective, model=model_cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_tok = out_dir / ".imported-tokenizer.json"
    _tokenizer_from_hf(hf_dir, tmp_tok)
    write_run_files(out_dir, cfg, tmp_tok)
    tmp_tok.unlink()
    save_weights(state, out_dir / "model.safetensors", {"imported_from": str(hf_dir)})
    return out_dir


def export_hf(run_dir: str | Path, out_dir: str | Path) -> Path:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    cfg = load_run_config(run_dir)
    check_family(run_dir, cfg, ("bert",))
    state = load_weights(run_dir / "model.safetensors")
    arch = hf_bert.hf_architecture(state)
    hf_state = hf_bert.state_to_hf(state, cfg.model)
    extra = {}
    if arch == "BertModel":
        hf_state = {k.removeprefix("bert."): v for k, v in hf_state.items()}
    if arch == "BertForSequenceClassification":
        labels = json.loads((run_dir / "labels.json").read_text()) if (run_dir / "labels.json").is_file() else None
        num = hf_state["classifier.weight"].shape[0]
        extra = {"num_labels": num, "problem_type": "regression" if num == 1 else "single_label_classification"}
        if labels:
            extra["id2label"] = {str(i): str(l) for i, l in enumerate(labels)}
            extra["label2id"] = {str(l): i for i, l in enumerate(labels)}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_weights(hf_state, out_dir / "model.safetensors", {"format": "pt"})
    atomic_write_text(out_dir / "config.json", json.dumps(hf_bert.config_to_hf(cfg.model, [arch], extra), indent=2))
    _export_tokenizer(run_dir / "tokenizer.json", out_dir, cfg.model.max_position)
    return out_dir


def _export_tokenizer(tokenizer_path: Path, out_dir: Path, max_length: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    (out_dir / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    model = json.loads(tok.to_str())["model"]
    config = {"model_max_length": max_length, "tokenizer_class": "PreTrainedTokenizerFast"}
    if model["type"] == "WordPiece":
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        (out_dir / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
        normalizer = json.loads(tok.to_str()).get("normalizer") or {}
        config.update({"tokenizer_class": "BertTokenizer",
                       "do_lower_case": bool(normalizer.get("lowercase", False)),
                       "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                       "cls_token": "[CLS]", "mask_token": "[MASK]"})
    atomic_write_text(out_dir / "tokenizer_config.json", json.dumps(config, indent=2))
