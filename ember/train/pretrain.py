"""`ember pretrain`: train an objective (``ember.objectives``) and save its run folder.

The objective's setup (``ember.objectives.setup.setup_pretraining``: module, data, held-out
evaluation, run files) is the same call for every objective; this module adds what training
needs around it: the distributed process group, the run folder (written only once the setup
worked), the Trainer, and the final weights and curves.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ember.config import RunConfig
from ember.objectives.setup import setup_pretraining
from ember.runs.checkpoint import save_weights
from ember.runs.folder import prepare_run_dir
from ember.train.checks import check_train_settings
from ember.train.distributed import init_distributed, restart_count, shutdown
from ember.train.loop import Trainer
from ember.train.scaling import effective_config


def run_pretraining(cfg: RunConfig, run_dir: Path, resume: bool = False, overwrite: bool = False,
                    progress: bool = True) -> dict:
    run_dir = Path(run_dir)
    check_train_settings(cfg.train)  # a bad setting is refused before any process group or file
    dist_info = init_distributed(cfg.train.device)
    # A worker restarted by `torchrun --max-restarts` continues the run from its last checkpoint.
    resume = resume or restart_count() > 0
    try:
        effective_config(cfg.train, dist_info.world_size)  # a batch the ranks cannot split: refused before any file
        torch.manual_seed(cfg.train.seed)  # same initial weights on every rank
        setup = setup_pretraining(cfg, run_dir, resume, progress and dist_info.is_main)
        if dist_info.is_main:
            prepare_run_dir(run_dir, resume, overwrite, inputs=(cfg.data.prepared, cfg.knowledge.init, cfg.init))
            run_dir.mkdir(parents=True, exist_ok=True)
            setup.write_files(run_dir)
        trainer = Trainer(setup.module, setup.train_data, setup.cfg.train, run_dir, dist_info, setup.evaluate,
                          progress=progress)
        if dist_info.is_main:
            print(f"{setup.description}, run folder {run_dir}")
        return train_and_save(trainer, run_dir, dist_info, resume)
    finally:
        shutdown(dist_info)


def train_and_save(trainer, run_dir: Path, dist_info, resume: bool) -> dict:
    """Train (or resume), then on the main rank save the final weights and plot the curves."""
    result = trainer.train(resume=resume)
    state = trainer.model_state()  # gathered from every rank's shard under FSDP
    if dist_info.is_main:
        save_weights(state, run_dir / "model.safetensors", {"step": trainer.step, "kind": "pretrain"})
        from ember.train.plots import plot_metrics

        plot_metrics(run_dir)
    return result
