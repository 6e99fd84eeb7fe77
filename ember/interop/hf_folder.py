"""A Hugging Face (or sentence-transformers) checkpoint folder, read and checked before use.

``read_hf_checkpoint(folder)`` is what ``ember convert --from-hf`` and ``--init FOLDER`` read:
the encoder's config and weights in ember's names, and, for a sentence-transformers folder
(``ember.interop.sentence_transformers``), the pooling, normalisation and max length it
declares. Every problem is found here, before anything is written, with one message each:

- an architecture ember cannot import (a token-classification or multiple-choice head, BigBird's
  QA head, a BERT decoder; an unknown ``model_type``);
- missing or unreadable weights, or weights that do not fit ``config.json`` (a missing layer,
  a vocabulary size other than the embedding matrix's);
- a tokenizer with more tokens than the embeddings have rows, or far fewer (another model's
  vocabulary): ``check_vocabulary``;
- a sentence-transformers pipeline ember does not reproduce (max pooling, a Dense layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ember.config import ModelConfig
from ember.errors import EmberError
from ember.runs.embedding import EmbeddingDefaults

# Encoder families whose HF head classes ember maps (the interop modules of the other families
# check their own architectures). Base models end in "Model"; "...LMHeadModel" is a causal LM.
_ENCODER_MODEL_TYPES = ("bert", "roberta", "albert", "electra", "distilbert", "longformer", "big_bird")
_HEADS = ("ForMaskedLM", "ForPreTraining", "ForSequenceClassification")
# A tokenizer may have fewer tokens than the embedding matrix has rows (vocabularies are padded
# to a multiple of 8 or 128 for speed, T5's 32,100 tokens sit in 32,128 rows); more than this
# many unused rows means another model's vocabulary.
_PADDING_ROWS = 128


@dataclass(frozen=True)
class HFCheckpoint:
    folder: Path  # the folder as given
    model_dir: Path  # the encoder's own folder (config.json, weights, tokenizer)
    model: ModelConfig
    state: dict  # ember names: backbone.*, and the heads the checkpoint has (mlm.*, nsp.*, ...)
    embedding: EmbeddingDefaults | None  # a sentence-transformers folder's pooling settings
    lowercase: bool = False  # sentence-transformers lower-cases inputs before its tokenizer


def read_hf_checkpoint(folder: str | Path) -> HFCheckpoint:
    from ember.interop.common import read_hf_config
    from ember.interop.families import import_checkpoint
    from ember.interop.sentence_transformers import read_sentence_transformers

    folder = Path(folder)
    if not folder.is_dir():
        raise EmberError(f"{folder}: no such folder; pass a Hugging Face checkpoint folder (config.json + "
                         "model.safetensors or pytorch_model.bin + a tokenizer)")
    st = read_sentence_transformers(folder)
    model_dir = st.model_dir if st is not None else folder
    hf_config = read_hf_config(model_dir)
    check_architecture(hf_config, model_dir / "config.json")
    try:
        cfg, state = import_checkpoint(hf_config, _read_weights(model_dir))
    except KeyError as exc:  # a family's renaming pops a tensor (e.g. a layer's query) that is absent
        raise _lacking(model_dir, [str(exc.args[0])]) from None
    check_weights_fit(cfg, state, model_dir)
    if st is not None and st.dimension not in (None, cfg.hidden_size):
        raise EmberError(f"{folder}: the Pooling module expects {st.dimension}-dimensional token vectors, but "
                         f"the encoder's hidden size is {cfg.hidden_size}; the folder's parts do not belong together")
    return HFCheckpoint(folder, model_dir, cfg, state, st.defaults if st else None, st.lowercase if st else False)


def check_architecture(hf_config: dict, where: Path) -> None:
    """Refuse heads whose weights would be misread (a token classifier's ``classifier`` looks
    like a sequence classifier's) and BERT used as a decoder."""
    if hf_config.get("model_type", "bert") not in _ENCODER_MODEL_TYPES:
        return  # other families' importers check their own (an unknown model_type is refused there)
    if hf_config.get("is_decoder") or hf_config.get("add_cross_attention"):
        raise EmberError(f"{where}: this is a decoder (is_decoder / add_cross_attention), not a "
                         "bidirectional encoder; ember imports encoders of this family")
    from ember.interop.families import QA_MODEL_TYPES

    for arch in hf_config.get("architectures") or []:
        if arch.endswith("ForQuestionAnswering") and hf_config.get("model_type", "bert") in QA_MODEL_TYPES:
            continue  # the start/end head, imported as a SQuAD run (ember.interop.convert)
        if not (arch.endswith(_HEADS) or (arch.endswith("Model") and not arch.endswith("LMHeadModel"))):
            raise EmberError(f"{where}: architecture {arch!r} cannot be imported; ember reads base models "
                             f"(…Model), the {', '.join('…' + h for h in _HEADS)} heads and the …ForQuestionAnswering "
                             f"of {', '.join(QA_MODEL_TYPES)}. To use "
                             "the encoder alone, save its base model (e.g. model.base_model.save_pretrained)")


def _read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from ember.interop.common import read_hf_weights

    try:
        return read_hf_weights(model_dir)
    except EmberError:
        raise
    except Exception as exc:  # safetensors / torch raise their own types for damaged files
        raise EmberError(f"{model_dir}: cannot read the weights ({type(exc).__name__}: {exc}); the file is "
                         "damaged or incomplete") from None


def check_weights_fit(cfg: ModelConfig, state: dict, where: Path) -> None:
    """Every backbone tensor the config implies is present with its shape (only a pooler may be
    absent: masked-LM checkpoints have none, fine-tuning starts it fresh)."""
    from ember.models import build_backbone

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        expected = {f"backbone.{k}": v.shape for k, v in build_backbone(cfg).state_dict().items()}
    missing = [k for k in expected if k not in state and not k.startswith("backbone.pooler.")]
    if missing:
        raise _lacking(where, missing)
    for key, shape in expected.items():
        if key in state and tuple(state[key].shape) != tuple(shape):
            hint = " (config.json's vocab_size)" if key.endswith("embeddings.word.weight") else ""
            raise EmberError(f"{where}: {key} has shape {tuple(state[key].shape)} in the weights but config.json "
                             f"implies {tuple(shape)}{hint}; config.json and the weights do not belong together")


def _lacking(where: Path, names: list[str]) -> EmberError:
    return EmberError(f"{where}: the weights lack tensor(s) config.json implies ({', '.join(names[:3])} in "
                      "ember's names); the checkpoint is incomplete or its config.json belongs to another model")


def check_vocabulary(tokenizer_path: Path, cfg: ModelConfig, where: Path, lowercase: bool = False) -> None:
    """The tokenizer's ids fit the embedding matrix (and are not another model's vocabulary).
    Checked for the encoder families; the other families' importers keep their own rules."""
    from ember.tokenizers import load_tokenizer

    if cfg.family not in _ENCODER_MODEL_TYPES:
        return
    tok = load_tokenizer(tokenizer_path)
    size = tok.get_vocab_size(with_added_tokens=True)
    if size > cfg.vocab_size or cfg.vocab_size - size > max(_PADDING_ROWS, cfg.vocab_size // 100):
        raise EmberError(f"{where}: the tokenizer has {size} tokens but the model's embeddings have "
                         f"{cfg.vocab_size} rows (config.json vocab_size); the tokenizer belongs to another "
                         "model. Put the checkpoint's own tokenizer.json (or vocab.txt) in the folder")
    if lowercase and tok.normalizer is not None and tok.normalizer.normalize_str("AbC") != "abc":
        raise EmberError(f"{where}: sentence_bert_config.json sets do_lower_case, but the tokenizer keeps "
                         "case; ember feeds texts to the tokenizer unchanged, so its vectors would differ")
    if lowercase and tok.normalizer is None:
        raise EmberError(f"{where}: sentence_bert_config.json sets do_lower_case, but the tokenizer has no "
                         "normalizer that lower-cases; ember feeds texts to the tokenizer unchanged")
