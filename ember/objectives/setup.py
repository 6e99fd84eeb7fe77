"""How `ember pretrain` gets an objective ready: its module, its data, its held-out evaluation
and the files its run folder needs, as one ``PretrainingSetup``.

Most objectives read the token shards of `ember prepare` (``setup_from_shards``): the corpus
fixes the vocabulary and special ids, the objective builds its own dataset layout when it
has one (``build_dataset``: GPT's packed blocks) and BERT's sentence-pair or packed-sentence
datasets otherwise. An objective whose data is different (ELMo reads words from raw text and
builds its own vocabulary) defines ``setup_pretraining(cfg, run_dir, resume, progress)`` in
its module and is reached the same way, through the objective registry.

Nothing is written here: the trainer's runner writes the run folder only once the setup
worked, so a configuration error leaves no half-made run behind.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from torch import nn

from ember.config import RunConfig
from ember.errors import EmberError


@dataclass
class PretrainingSetup:
    cfg: RunConfig  # the settings as the run folder records them (e.g. the corpus's pad id)
    module: nn.Module  # the objective with a fresh backbone
    train_data: Any  # len() and example(index, epoch), for ember.train.loop.Trainer
    evaluate: Callable[[nn.Module], dict] | None  # held-out metrics, or None without held-out data
    write_files: Callable[[Path], None]  # config.yaml, tokenizer/vocabulary into the run folder
    description: str  # one line for the log: what is trained on what


# Held-out batches hold at most this many tokens: 32 sequences of 512, the batch every run
# evaluated at before long models existed. A 1,024-token model evaluates 16 sequences at a time,
# so held-out evaluation never needs more memory than a 512-token model's did.
HELD_OUT_TOKENS = 32 * 512


def held_out_batch_size(max_seq_length: int) -> int:
    """Sequences per held-out batch: 32, fewer for sequences longer than 512 tokens."""
    return max(1, min(32, HELD_OUT_TOKENS // max(max_seq_length, 1)))


def held_out_metrics(module, dataset, n_examples: int, batch_size: int, seed: int, device: str) -> dict:
    """Held-out metrics on a fixed set of examples with fixed masks (comparable over time),
    plus what the objective derives from them (``derived_metrics``: perplexities)."""
    sums: dict[str, list[float]] = {}
    indices = range(min(n_examples, len(dataset)))
    for b, start in enumerate(range(0, len(indices), batch_size)):
        examples = [dataset.example(i, 0) for i in indices[start : start + batch_size]]
        batch = module.make_batch(examples, np.random.default_rng([seed, 31337, b]))
        _, metrics = module({k: v.to(device) for k, v in batch.items()})
        for name, (total, count) in metrics.items():
            acc = sums.setdefault(name, [0.0, 0.0])
            acc[0] += total
            acc[1] += count
    result = {name: total / max(count, 1) for name, (total, count) in sums.items()}
    derived = getattr(module, "derived_metrics", None)
    return {**result, **derived(result)} if derived is not None else result


def objective_dataset(module, corpus, data_cfg, seed: int, sep_id: int):
    """The objective's own data layout when it has one (causal LM blocks), else the
    sentence-pair / packed-sentence datasets of ``build_pretraining_dataset``."""
    from ember.data.packing import build_pretraining_dataset

    if hasattr(module, "build_dataset"):
        return module.build_dataset(corpus, data_cfg, seed)
    return build_pretraining_dataset(corpus, data_cfg, module.pair_mode, seed, sep_id)


def setup_from_shards(cfg: RunConfig, run_dir: Path, resume: bool, progress: bool) -> PretrainingSetup:
    """An objective over the token shards of `ember prepare` (``data.prepared``)."""
    from ember.data.shards import TokenCorpus
    from ember.objectives import build_objective
    from ember.tokenizers import end_of_text_id, load_tokenizer, special_token_ids

    if not cfg.data.prepared:
        raise EmberError("data.prepared is not set: pass --data DIR (a folder written by `ember prepare`)")
    corpus = TokenCorpus(cfg.data.prepared, "train")
    tokenizer = load_tokenizer(corpus.tokenizer_path)
    vocab = tokenizer.get_vocab_size()
    if vocab > cfg.model.vocab_size:
        raise EmberError(f"the tokenizer has {vocab} tokens but model.vocab_size={cfg.model.vocab_size}; "
                         f"set --set model.vocab_size={vocab}")
    if cfg.data.max_seq_length > cfg.model.max_position:
        raise EmberError(f"data.max_seq_length={cfg.data.max_seq_length} exceeds model.max_position="
                         f"{cfg.model.max_position}")
    if cfg.data.masking == "phrase" and not corpus.has_joins:
        raise EmberError(f"data.masking=phrase needs phrase units stored in {cfg.data.prepared}; "
                         "re-run `ember prepare` with --phrases spans or --phrases detect")
    special = special_token_ids(tokenizer)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pad_token_id=special["pad"]))
    # Masking schemes beyond single tokens read word boundaries from the tokenizer.
    module = build_objective(cfg, {**special, "eot": end_of_text_id(tokenizer),
                                   "tokenizer_path": str(corpus.tokenizer_path)})
    started, embedding = "", None
    if cfg.init:
        from ember.runs.checkpoint import list_checkpoints

        if resume and list_checkpoints(run_dir):
            started = f", continuing {cfg.init} (weights from the checkpoint)"
        else:  # a new run, or a torchrun restart before its first checkpoint
            fresh, embedding = load_start_weights(module, cfg.init)
            started = f", continuing {cfg.init}" + (f" (fresh heads: {', '.join(fresh)})" if fresh else "")
    train_data = objective_dataset(module, corpus, cfg.data, cfg.train.seed, special["sep"])
    evaluate = None
    try:
        valid = TokenCorpus(cfg.data.prepared, "valid")
        valid_data = objective_dataset(module, valid, cfg.data, cfg.train.seed + 1, special["sep"])
    except EmberError as exc:
        print(f"warning: no held-out evaluation ({exc})")
    else:
        def evaluate(m):
            return held_out_metrics(m, valid_data, cfg.data.eval_examples, held_out_batch_size(cfg.data.max_seq_length),
                                    cfg.train.seed, cfg.train.device)

    params = sum(p.numel() for p in module.backbone.parameters())
    return PretrainingSetup(
        cfg, module, train_data, evaluate,
        write_files=lambda folder: write_start_files(folder, cfg, corpus.tokenizer_path, embedding),
        description=f"pre-training {cfg.objective} on {corpus.num_tokens:,} tokens ({len(train_data):,} "
                    f"sequences/epoch), backbone {params / 1e6:.1f}M parameters{started}")


def load_start_weights(module: nn.Module, init: str):
    """Load ``init``'s weights (``ember.runs.init.load_start``: backbone and heads) into the
    objective's ``module``, tensor for tensor; return the heads the init lacks, which keep their
    fresh initialisation (MiniLM has no MLM head), and the init's embedding defaults (or None).
    Every backbone tensor must come from the init with its shape; the init's other heads (a
    classifier, NSP under objective mlm) are left out."""
    from ember.runs.init import load_start

    start = load_start(init)
    state = start.state
    own = module.state_dict()
    missing = [k for k in own if k.startswith("backbone.") and k not in state]
    wrong = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or wrong:
        what = f"lacks {missing[:3]}" if missing else (f"has {wrong[0]} of shape {tuple(state[wrong[0]].shape)}, "
                                                       f"the model {tuple(own[wrong[0]].shape)}")
        raise EmberError(f"--init {init}: its weights do not fit the model its config describes (it {what})")
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
    return sorted({k.split(".")[0] for k in own if k not in state}), start.embedding


def write_start_files(folder: Path, cfg: RunConfig, tokenizer_path: Path, embedding=None) -> None:
    """config.yaml and tokenizer.json; for a run continuing an init, the init's embedding
    defaults too (RUN/embedding.json: `ember embed` pools and normalises as the init did). The
    init's labels.json is not carried: a pre-training run has no task head to name."""
    from ember.runs.folder import write_run_files

    write_run_files(folder, cfg, tokenizer_path)
    if embedding is not None:
        from ember.runs.embedding import write_embedding_defaults

        write_embedding_defaults(folder, embedding)


def setup_pretraining(cfg: RunConfig, run_dir: Path, resume: bool, progress: bool) -> PretrainingSetup:
    """The objective's own setup when its module defines one, else ``setup_from_shards``."""
    from ember.objectives import objective_module

    setup = getattr(objective_module(cfg.objective), "setup_pretraining", setup_from_shards)
    return setup(cfg, Path(run_dir), resume, progress)
