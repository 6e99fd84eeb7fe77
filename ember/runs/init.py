"""Where fine-tuning weights start: an ember run folder, an HF checkpoint folder, or random.

``load_init`` returns an ``Init``: the backbone's ModelConfig, its weights (``backbone.*`` names
stripped of the prefix; None for a random start) and the tokenizer that goes with them. It
unpacks as a triple, and the library functions (``ember.api``) accept one in place of a path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

from ember.config import DECODER_FAMILIES, ENCODER_FAMILIES, SEQ2SEQ_FAMILIES, ModelConfig, model_preset
from ember.errors import EmberError
from ember.runs.checkpoint import load_weights
from ember.runs.embedding import EmbeddingDefaults, read_embedding_defaults
from ember.runs.folder import check_family, load_run_config

# Every encoder variant fine-tunes the same way; GPT decoders the GPT-1 way (ember.tasks.families.gpt),
# XLNet its own way (ember.tasks.families.xlnet), T5 text to text (ember.tasks.text2text.task), Dai & Le's
# LSTM with a classifier on its states (ember.tasks.families.lstm).
# BART fine-tunes text to text on T5's adapters.
SUPPORTED_FAMILIES = ENCODER_FAMILIES + DECODER_FAMILIES + SEQ2SEQ_FAMILIES + ("xlnet", "lstm")  # families that fine-tune today


class Init(NamedTuple):
    model: ModelConfig
    state: dict | None  # backbone weights, or None for a random start
    tokenizer: Path  # tokenizer.json


def backbone_weights(state: dict) -> dict:
    return {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}


def load_init(init: str | Path | Init, preset: str = "", tokenizer: str = "") -> Init:
    """(model config, backbone state or None for random init, tokenizer.json path)."""
    if isinstance(init, Init):
        return init
    init = str(init)
    if init in ("", "random"):
        if not preset or not tokenizer:
            raise EmberError("a randomly initialised model needs --model PRESET and --tokenizer tokenizer.json")
        from ember.tokenizers import load_tokenizer, special_token_ids

        tok = load_tokenizer(tokenizer)
        cfg = dataclasses.replace(model_preset(preset), vocab_size=tok.get_vocab_size(),
                                  pad_token_id=special_token_ids(tok)["pad"])
        return Init(cfg, None, Path(tokenizer))
    path = Path(init)
    if (path / "config.yaml").is_file():
        run_cfg = load_run_config(path)
        check_family(path, run_cfg, SUPPORTED_FAMILIES)
        weights = path / "model.safetensors"
        if not weights.is_file():
            raise EmberError(f"{path} has no model.safetensors yet (is its training still running? "
                             "a finished or interrupted-and-resumed run writes it at the end)")
        return Init(run_cfg.model, backbone_weights(load_weights(weights)), path / "tokenizer.json")
    if (path / "config.json").is_file() or (path / "modules.json").is_file():
        # Any family with HF interop, chosen by config.json's model_type, or a sentence-transformers
        # folder (its encoder may sit in a sub-folder). The config keeps the family's pooler even
        # when the checkpoint has none (XForMaskedLM): fine-tuning then initialises it fresh, as
        # transformers' XForSequenceClassification does.
        start = _hf_init(path)
        return Init(start.model, backbone_weights(start.state), start.tokenizer)
    if path.is_dir() and any(path.glob("seed-*/config.yaml")):
        load_run_config(path)  # a multi-seed folder: the error names its seed runs
    raise EmberError(f"--init {init}: not an ember run folder (config.yaml) nor an HF checkpoint "
                     "(config.json); use 'random' to start from scratch")


def _hf_init(path: Path) -> Init:
    """An HF checkpoint folder: its config, whole state in ember's names and checked tokenizer."""
    return _hf_checkpoint(path)[0]


def _hf_checkpoint(path: Path) -> tuple[Init, EmbeddingDefaults | None]:
    """``_hf_init`` and the folder's sentence-transformers pooling settings (None: not such a folder)."""
    from ember.interop.hf_folder import check_vocabulary, read_hf_checkpoint

    checkpoint = read_hf_checkpoint(path)
    tokenizer_path = checkpoint.model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise EmberError(f"{checkpoint.model_dir} has no tokenizer.json; import it first with "
                         "`ember convert --from-hf` (which also reads vocab.txt or vocab.json + merges.txt)")
    check_vocabulary(tokenizer_path, checkpoint.model, checkpoint.model_dir, checkpoint.lowercase)
    return Init(checkpoint.model, dict(checkpoint.state), tokenizer_path), checkpoint.embedding


class Start(NamedTuple):
    """Where continued pre-training starts (``load_start``)."""

    model: ModelConfig
    state: dict  # the whole state in ember's names: backbone.* and the heads it has
    tokenizer: Path  # tokenizer.json
    objective: str  # what an ember pre-training run was trained with; "" otherwise (an HF folder, a fine-tuned run)
    embedding: EmbeddingDefaults | None  # its sentence-vector defaults (RUN/embedding.json, sentence-transformers')


def load_start(init: str | Path) -> Start:
    """Where continued pre-training (`ember pretrain --init`) starts: ``load_init``'s model config
    and tokenizer with the *whole* state in ember's names (``backbone.*`` and the heads it has:
    ``mlm.*``, ``nsp.*``, ``lm.bias``, ``backbone.final_logits_bias``, ...), so a head trained
    before is trained on, not redrawn; the objective it was pre-trained with and its embedding
    defaults. ``init`` is an ember run, one of its checkpoints (``RUN/checkpoints/step-N``, sharded
    or not) or an HF checkpoint folder."""
    from ember.runs.sharded import weights_view

    path = Path(init)
    if (path / "config.json").is_file() or (path / "modules.json").is_file():
        start, embedding = _hf_checkpoint(path)
        return Start(*start, "", embedding)
    if not path.is_dir():
        raise EmberError(f"--init {init}: no such folder; give an ember run folder, one of its checkpoints "
                         "(RUN/checkpoints/step-N) or an HF checkpoint folder")
    with weights_view(path) as folder:  # a checkpoint: its run's files beside the checkpoint's weights
        if not (folder / "config.yaml").is_file():
            load_init(folder)  # the error that names what the folder is not
        run_cfg = load_run_config(folder)
        check_family(path, run_cfg, SUPPORTED_FAMILIES)
        return Start(run_cfg.model, load_weights(folder / "model.safetensors"), (folder / "tokenizer.json").resolve(),
                     run_cfg.objective if run_cfg.kind == "pretrain" else "", read_embedding_defaults(folder))
