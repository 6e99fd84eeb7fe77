"""`ember convert`: HF checkpoint folder <-> ember run folder, for every family with interop.

Import reads ``config.json`` + ``model.safetensors``/``pytorch_model.bin`` + a tokenizer
(``tokenizer.json``, WordPiece ``vocab.txt`` or byte-level BPE ``vocab.json`` +
``merges.txt``) and writes an ember run folder usable by ``ember finetune --init`` and
``ember fill-mask``. The family comes from ``model_type`` (ember.interop.families). A
sentence-transformers folder (``modules.json``) also records its pooling, normalisation and
max length in ``RUN/embedding.json`` (ember.runs.embedding), the defaults of ``ember embed``.
Export writes the HF layout: ``config.json``, ``model.safetensors`` (HF names),
``tokenizer.json`` (+ ``vocab.txt`` for WordPiece, ``vocab.json``/``merges.txt`` for BPE)
and ``tokenizer_config.json``, loadable with transformers' ``from_pretrained`` /
``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ember.config import DataConfig, RunConfig
from ember.errors import EmberError
from ember.interop.families import interop_for_family, interop_for_model
from ember.runs.checkpoint import atomic_write_text, load_weights, save_weights
from ember.runs.folder import load_run_config, write_run_files


def _objective(state: dict, family: str = "bert", model_cfg=None) -> str:
    """The pre-training objective whose heads the imported weights carry."""
    from ember.config import DECODER_FAMILIES

    own = getattr(interop_for_family(family), "objective_for", None)  # a family that decides itself (XLM)
    if own is not None and model_cfg is not None:
        return own(model_cfg)
    if family in DECODER_FAMILIES:
        return "clm"  # GPT-1/GPT-2: the causal LM head is the tied embedding matrix
    fixed = getattr(interop_for_family(family), "OBJECTIVE", None)  # a family with one objective (XLNet)
    if fixed:
        return fixed
    heads = {k.split(".", 1)[0] for k in state}
    if "nsp" in heads:
        return "bert"  # MLM + next-sentence prediction
    if "sop" in heads:
        return "albert"  # MLM + sentence-order prediction
    if "rtd_head" in heads:
        return "electra"  # replaced-token detection (discriminator only)
    return "mlm"


def import_hf(hf_dir: str | Path, out_dir: str | Path) -> Path:
    """Everything is read and checked (``ember.interop.hf_folder``) before ``out_dir`` is touched;
    a sentence-transformers folder's pooling settings go to RUN/embedding.json."""
    import tempfile

    from ember.interop.hf_folder import check_vocabulary, read_hf_checkpoint
    from ember.runs.embedding import EMBEDDING_FILE, write_embedding_defaults

    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    checkpoint = read_hf_checkpoint(hf_dir)
    model_cfg, state = checkpoint.model, checkpoint.state
    objective = _objective(state, model_cfg.family, model_cfg)
    kind = "finetune" if any(k.startswith(("classifier.", "qa_outputs.")) for k in state) else "pretrain"
    cfg = RunConfig(kind=kind, objective=objective, model=model_cfg, data=DataConfig(nsp=objective == "bert"))
    with tempfile.TemporaryDirectory(prefix="ember-import-") as tmp:
        tmp_tok = Path(tmp) / "tokenizer.json"
        _tokenizer_from_hf(checkpoint.model_dir, tmp_tok)
        _drop_fixed_padding(tmp_tok)
        check_vocabulary(tmp_tok, model_cfg, checkpoint.model_dir, checkpoint.lowercase)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_run_files(out_dir, cfg, tmp_tok)
    save_weights(state, out_dir / "model.safetensors", {"imported_from": str(hf_dir)})
    if checkpoint.embedding is not None:
        write_embedding_defaults(out_dir, checkpoint.embedding)
    else:
        (out_dir / EMBEDDING_FILE).unlink(missing_ok=True)  # a previous import's settings do not apply
    return out_dir


def export_hf(run_dir: str | Path, out_dir: str | Path) -> Path:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    cfg = load_run_config(run_dir)
    if cfg.knowledge.graph or cfg.knowledge.entities:
        raise EmberError(f"{run_dir} was fine-tuned with knowledge (K-BERT triples or ERNIE entities, "
                         "docs/knowledge.md); its inputs have no transformers counterpart, so an export "
                         "would read plain text differently. Use `ember evaluate`/`ember predict` on the run")
    if cfg.task.features:
        raise EmberError(f"{run_dir} is a feature-based run (frozen encoder + learned layer mix, "
                         "`ember finetune --features`); transformers has no model class for it. Use "
                         "`ember predict`/`ember evaluate` on the run folder, or fine-tune without --features")
    interop = interop_for_model(cfg.model)
    state = load_weights(run_dir / "model.safetensors")
    arch = interop.hf_architecture(state)
    hf_state = interop.state_to_hf(state, cfg.model)
    extra = {}
    if "classifier.weight" in state:
        labels = json.loads((run_dir / "labels.json").read_text()) if (run_dir / "labels.json").is_file() else None
        num = state["classifier.weight"].shape[0]
        extra = {"num_labels": num, "problem_type": "regression" if num == 1 else "single_label_classification"}
        if labels:
            extra["id2label"] = {str(i): str(l) for i, l in enumerate(labels)}
            extra["label2id"] = {str(l): i for i, l in enumerate(labels)}
    from ember.config import DECODER_FAMILIES, SEQ2SEQ_FAMILIES

    seq2seq = cfg.model.family in SEQ2SEQ_FAMILIES
    if cfg.model.family in DECODER_FAMILIES or seq2seq:  # generate() stops at end-of-text (T5: </s>)
        from ember.tokenizers import end_of_text_id, load_tokenizer, sequence_end_id

        tok = load_tokenizer(run_dir / "tokenizer.json")
        eot = sequence_end_id(tok) if seq2seq else end_of_text_id(tok)  # BART's BPE also has <|endoftext|>
        extra = {**extra, "eos_token_id": eot} if seq2seq else {**extra, "bos_token_id": eot, "eos_token_id": eot}
    hf_config = interop.config_to_hf(cfg.model, [arch], extra)
    if arch.endswith("Model"):  # a base model keeps its weights without the "roberta." etc. prefix
        hf_state = {k.removeprefix(hf_config["model_type"] + "."): v for k, v in hf_state.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_weights(hf_state, out_dir / "model.safetensors", {"format": "pt"})
    atomic_write_text(out_dir / "config.json", json.dumps(hf_config, indent=2))
    _export_tokenizer(run_dir / "tokenizer.json", out_dir, cfg.model.max_position,
                      segments=cfg.model.type_vocab_size > 1,
                      causal=cfg.model.family in DECODER_FAMILIES,
                      seq2seq_pad=cfg.model.pad_token_id if seq2seq else None,
                      settings=getattr(interop, "TOKENIZER_SETTINGS", None))
    from ember.runs.embedding import read_embedding_defaults

    embedding = read_embedding_defaults(run_dir)  # an imported sentence encoder's pooling goes back out with it
    if embedding is not None:
        from ember.interop.sentence_transformers import write_sentence_transformers

        write_sentence_transformers(out_dir, embedding, cfg.model.hidden_size, cfg.model.max_position)
    from ember.interop.model_card import write_model_card

    if not (out_dir / "README.md").is_file():  # a sentence-transformers layout may have written its own
        write_model_card(run_dir, out_dir, cfg, hf_config)
    return out_dir


# ---- tokenizers -------------------------------------------------------------------------

def _tokenizer_from_hf(hf_dir: Path, out_path: Path) -> None:
    """Write the HF folder's tokenizer as one ``tokenizer.json``."""
    if (hf_dir / "tokenizer.json").is_file():
        out_path.write_bytes((hf_dir / "tokenizer.json").read_bytes())
        return
    tok_cfg = hf_dir / "tokenizer_config.json"
    settings = json.loads(tok_cfg.read_text()) if tok_cfg.is_file() else {}
    if (hf_dir / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        lowercase = settings.get("do_lower_case", True)
        BertWordPieceTokenizer(str(hf_dir / "vocab.txt"), lowercase=lowercase).save(str(out_path))
        return
    if (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():
        vocab = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
        if "<|endoftext|>" in vocab and "<s>" not in vocab:  # GPT-2's own vocabulary
            _gpt2_bpe(hf_dir).save(str(out_path))
            return
        _roberta_bpe(hf_dir, settings.get("add_prefix_space", False)).save(str(out_path))
        return
    raise EmberError(f"{hf_dir} has no tokenizer.json, vocab.txt or vocab.json + merges.txt (a "
                     "SentencePiece spiece.model cannot be read directly); write a tokenizer.json with "
                     "transformers: AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")


def _drop_fixed_padding(path: Path) -> None:
    """Checkpoints often save their tokenizer.json padding every input to a fixed length (e.g.
    all-MiniLM-L6-v2: 128) and truncating; ember pads and truncates per use (a batch's longest
    row, the task's max length), and code that encodes one text at a time (fill-mask, corpus
    preparation) must not see padding as text."""
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(path)
    if tok.padding is not None or tok.truncation is not None:
        tok.no_padding()
        tok.no_truncation()
        tok.save(str(path))


def _roberta_bpe(hf_dir: Path, add_prefix_space: bool):
    """RoBERTa's / GPT-2's byte-level BPE from vocab.json + merges.txt, with RoBERTa's
    ``<s> A </s></s> B </s>`` template (Liu et al. 2019; transformers' RobertaTokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    specials = [t for t in ("<s>", "<pad>", "</s>", "<unk>") if tok.token_to_id(t) is not None]
    tok.add_special_tokens(specials)
    if tok.token_to_id("<mask>") is not None:
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False)])  # "a <mask>" eats the space
    if tok.token_to_id("<s>") is None or tok.token_to_id("</s>") is None:
        raise EmberError(f"{hf_dir / 'vocab.json'} has no <s> / </s> tokens; it is not a RoBERTa vocabulary")
    tok.post_processor = processors.RobertaProcessing(  # (sep, cls): the binding's positional order
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")),
        trim_offsets=True, add_prefix_space=add_prefix_space)
    return tok


def _gpt2_bpe(hf_dir: Path):
    """GPT-2's byte-level BPE from vocab.json + merges.txt: no template, no prefix space,
    ``<|endoftext|>`` as its one special token (transformers' GPT2Tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def _export_tokenizer(tokenizer_path: Path, out_dir: Path, max_length: int, segments: bool,
                      causal: bool = False, seq2seq_pad: int | None = None,
                      settings: dict | None = None) -> None:
    """tokenizer.json plus the files and settings ``AutoTokenizer.from_pretrained`` needs.

    ``PreTrainedTokenizerFast`` runs the saved tokenizer.json as is. A BertTokenizer class
    for WordPiece keeps older tooling happy; ``strip_accents: false`` matches ember's
    normalizer (transformers otherwise strips accents whenever it lower-cases). Models with
    one or no segment embedding (RoBERTa, DistilBERT) take no ``token_type_ids``. A causal LM
    (GPT) reads plain text as GPT-2's tokenizer gives it: no <s> ... </s> template. A seq2seq
    model (T5, ``seq2seq_pad`` = its pad id) names T5's roles: pad (the decoder's start), the
    </s> that ends every sequence, unk; sentinels are special tokens of tokenizer.json itself.
    A family's own ``settings`` (its interop module's TOKENIZER_SETTINGS, e.g. XLNet's left
    padding) win.
    """
    from ember.tokenizers import end_of_text_id, load_tokenizer, sequence_end_id, special_token_ids, tokenizer_kind

    tok = load_tokenizer(tokenizer_path)
    if causal and tokenizer_kind(tok) == "bpe":
        from tokenizers import processors

        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        atomic_write_text(out_dir / "tokenizer.json", tok.to_str())
    else:
        (out_dir / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    if seq2seq_pad is not None:
        names = {"pad": tok.id_to_token(seq2seq_pad), "eos": tok.id_to_token(sequence_end_id(tok))}
        names.update({role: t for role, t in (("bos", "<s>"), ("mask", "<mask>")) if tok.token_to_id(t) is not None})
        names.update({"unk": t for t in ("[UNK]", "<unk>") if tok.token_to_id(t) is not None})
    else:
        try:
            names = {role: tok.id_to_token(i) for role, i in special_token_ids(tok).items()}
        except EmberError:  # GPT-2's vocabulary: <|endoftext|> is its only special token
            eot = tok.id_to_token(end_of_text_id(tok))
            names = {"unk": eot, "bos": eot, "eos": eot}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        **{f"{role}_token": name for role, name in names.items()},
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"] if segments
        else ["input_ids", "attention_mask"],
    }
    kind = tokenizer_kind(tok)
    if kind == "wordpiece":
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        (out_dir / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
        normalizer = json.loads(tok.to_str()).get("normalizer") or {}
        config.update(tokenizer_class="BertTokenizer", strip_accents=False,
                      do_lower_case=bool(normalizer.get("lowercase", False)))
    elif kind == "bpe":
        tok.model.save(str(out_dir))  # vocab.json + merges.txt, the files RoBERTa ships
        if causal:  # GPT-2's roles: the end-of-text token starts and ends a text (config.json's bos/eos ids)
            eot = tok.id_to_token(end_of_text_id(tok))
            config.update(bos_token=eot, eos_token=eot)
        elif "cls" in names:
            config.update(bos_token=names["cls"], eos_token=names["sep"])
    config.update(settings or {})
    atomic_write_text(out_dir / "tokenizer_config.json", json.dumps(config, indent=2))
