"""Where fine-tuning weights start: an ember run folder, an HF checkpoint folder, or random.

``load_init`` returns an ``Init``: the backbone's ModelConfig, its weights (``backbone.*`` names
stripped of the prefix; None for a random start) and the tokenizer that goes with them. It
unpacks as a triple, and the library functions (``ember.api``) accept one in place of a path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

from ember.config import DECODER_FAMILIES, ENCODER_FAMILIES, ModelConfig, model_preset
from ember.errors import EmberError
from ember.runs.checkpoint import load_weights
from ember.runs.folder import check_family, load_run_config

# Every encoder variant fine-tunes the same way; GPT decoders the GPT-1 way (ember.tasks.gpt_classification).
SUPPORTED_FAMILIES = ENCODER_FAMILIES + DECODER_FAMILIES  # families that fine-tune today
SUPPORTED_FAMILIES += ("lstm",)  # Dai & Le's LSTM (ember.tasks.lstm_classifier)


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
    if (path / "config.json").is_file():
        # Any family with HF interop, chosen by config.json's model_type. The config keeps
        # the family's pooler even when the checkpoint has none (XForMaskedLM): fine-tuning
        # then initialises it fresh, as transformers' XForSequenceClassification does.
        from ember.interop.common import read_hf_config, read_hf_weights
        from ember.interop.families import interop_for_hf_config

        hf_config = read_hf_config(path)
        interop = interop_for_hf_config(hf_config)
        cfg = interop.config_from_hf(hf_config)
        state = backbone_weights(interop.state_from_hf(read_hf_weights(path), cfg))
        if not (path / "tokenizer.json").is_file():
            raise EmberError(f"{path} has no tokenizer.json; import it first with `ember convert --from-hf`")
        return Init(cfg, state, path / "tokenizer.json")
    raise EmberError(f"--init {init}: not an ember run folder (config.yaml) nor an HF checkpoint "
                     "(config.json); use 'random' to start from scratch")
