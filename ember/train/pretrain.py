"""`ember pretrain`: build the objective, the data and the trainer from a RunConfig."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from ember.config import RunConfig
from ember.errors import EmberError
from ember.objectives import build_objective
from ember.runs.checkpoint import save_weights
from ember.train.distributed import init_distributed, shutdown
from ember.train.loop import Trainer
from ember.runs.folder import prepare_run_dir, write_run_files


def evaluate_pretraining(module, dataset, n_examples: int, batch_size: int, seed: int, device: str) -> dict:
    """Held-out metrics on a fixed set of examples with fixed masks (comparable over time)."""
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
    derived = getattr(module, "derived_metrics", None)  # e.g. the causal LM's perplexity
    return {**result, **derived(result)} if derived is not None else result


def objective_dataset(module, corpus, data_cfg, seed: int, sep_id: int):
    """The objective's own data layout when it has one (causal LM blocks), else the
    sentence-pair / packed-sentence datasets of ``build_pretraining_dataset``."""
    from ember.data.packing import build_pretraining_dataset

    if hasattr(module, "build_dataset"):
        return module.build_dataset(corpus, data_cfg, seed)
    return build_pretraining_dataset(corpus, data_cfg, module.pair_mode, seed, sep_id)


def run_pretraining(cfg: RunConfig, run_dir: Path, resume: bool = False, overwrite: bool = False,
                    progress: bool = True) -> dict:
    from ember.data.shards import TokenCorpus
    from ember.tokenizers import end_of_text_id, special_token_ids, load_tokenizer

    if cfg.objective == "bilm":  # ELMo reads words from raw text, not sub-word shards
        from ember.train.pretrain_elmo import run_elmo_pretraining

        return run_elmo_pretraining(cfg, run_dir, resume, overwrite, progress)
    run_dir = Path(run_dir)
    if not cfg.data.prepared:
        raise EmberError("data.prepared is not set: pass --data DIR (a folder written by `ember prepare`)")
    dist_info = init_distributed(cfg.train.device)
    try:
        corpus = TokenCorpus(cfg.data.prepared, "train")
        tokenizer = load_tokenizer(corpus.tokenizer_path)
        vocab = tokenizer.get_vocab_size()
        if vocab > cfg.model.vocab_size:
            raise EmberError(
                f"the tokenizer has {vocab} tokens but model.vocab_size={cfg.model.vocab_size}; "
                f"set --set model.vocab_size={vocab}"
            )
        if cfg.data.max_seq_length > cfg.model.max_position:
            raise EmberError(f"data.max_seq_length={cfg.data.max_seq_length} exceeds model.max_position="
                             f"{cfg.model.max_position}")
        if cfg.data.masking == "phrase" and not corpus.has_joins:
            raise EmberError(f"data.masking=phrase needs phrase units stored in {cfg.data.prepared}; "
                             "re-run `ember prepare` with --phrases spans or --phrases detect")
        special = special_token_ids(tokenizer)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pad_token_id=special["pad"]))
        torch.manual_seed(cfg.train.seed)  # same initial weights on every rank
        # Masking schemes beyond single tokens read word boundaries from the tokenizer.
        module = build_objective(cfg, {**special, "eot": end_of_text_id(tokenizer),
                                       "tokenizer_path": str(corpus.tokenizer_path)})
        train_data = objective_dataset(module, corpus, cfg.data, cfg.train.seed, special["sep"])
        evaluate = None
        try:
            valid = TokenCorpus(cfg.data.prepared, "valid")
            valid_data = objective_dataset(module, valid, cfg.data, cfg.train.seed + 1, special["sep"])
        except EmberError as exc:
            print(f"warning: no held-out evaluation ({exc})")
        else:
            def held_out(m):
                return evaluate_pretraining(m, valid_data, cfg.data.eval_examples, 32,
                                            cfg.train.seed, cfg.train.device)

            evaluate = held_out
        # Only now that objective and data are known to work does the run folder get written,
        # so a configuration error leaves no half-made run behind.
        if dist_info.is_main:
            prepare_run_dir(run_dir, resume, overwrite)
            write_run_files(run_dir, cfg, corpus.tokenizer_path)
        trainer = Trainer(module, train_data, cfg.train, run_dir, dist_info, evaluate, progress=progress)
        if dist_info.is_main:
            params = sum(p.numel() for p in module.backbone.parameters())
            print(f"pre-training {cfg.objective} on {corpus.num_tokens:,} tokens "
                  f"({len(train_data):,} sequences/epoch), backbone {params / 1e6:.1f}M parameters, "
                  f"run folder {run_dir}")
        return train_and_save(trainer, module, run_dir, dist_info, resume)
    finally:
        shutdown(dist_info)


def train_and_save(trainer, module, run_dir: Path, dist_info, resume: bool) -> dict:
    """Train (or resume), then on the main rank save the final weights and plot the curves."""
    result = trainer.train(resume=resume)
    if dist_info.is_main:
        save_weights(module.state_dict(), run_dir / "model.safetensors", {"step": trainer.step, "kind": "pretrain"})
        from ember.train.plots import plot_metrics

        plot_metrics(run_dir)
    return result

