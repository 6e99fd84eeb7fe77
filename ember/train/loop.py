"""The training loop, shared by pre-training objectives and fine-tuning tasks.

The trained module (an objective or a task model) provides ``make_batch(examples, rng)``
and ``forward(batch) -> (loss, metrics)`` with metrics as name -> (sum, count). The data is
any object with ``len()`` and ``example(index, epoch)``.

Determinism, which exact resume rests on: the examples of optimizer step ``s`` are positions
``s*G .. s*G+G-1`` of an endless stream that visits the dataset in a fresh seeded permutation
per epoch (G = global batch). Rank r of W takes its contiguous share, split into
``grad_accum`` micro-batches. Corruption RNG and dropout seeds are keyed by (seed, step,
global micro-batch). So a run resumed from the checkpoint of step s replays steps s+1.. exactly.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError
from ember.nn.dropout import switch_off_dropout
from ember.runs import checkpoint as ckpt
from ember.train.checks import check_train_settings
from ember.train.clock import step_clock
from ember.train.distributed import DistInfo, agree, all_reduce_sums, barrier, gradient_sync
from ember.train.fsdp import full_model_state, shard
from ember.host_memory import KeptMemoryCap, keep_freed_host_memory, return_freed_host_memory
from ember.train.length_groups import (GROUPED, SHUFFLED, SPREAD, group_by_length, spread_by_length,
                                       wants_length_groups)
from ember.train.scaling import chose_no_layout, cpu_micro_batches, effective_config
from ember.train.sharded_checkpoint import resume_checkpoint, save_sharded_checkpoint
from ember.train.logging import MetricsLogger, tell_evaluation
from ember.train.tracking import hardware
from ember.train.optim import build_optimizer, lr_factor, set_lr
from ember.train.precision import autocast_context, check_speed


class DataOrder:
    """Maps a global example position to a dataset index: one seeded permutation per epoch, its
    batches grouped by length when the examples' ``lengths`` are given, with examples of one of
    ``groups`` kept apart (``ember.train.length_groups``: ``name`` SPREAD, or GROUPED, the earlier
    grouping that ignores groups, which checkpoints written with it resume in)."""

    def __init__(self, size: int, seed: int, lengths=None, batch_size: int = 0, groups=None,
                 name: str = SPREAD) -> None:
        if size == 0:
            raise EmberError("the training data has no examples")
        self.size, self.seed, self._epoch, self._perm = size, seed, -1, None
        self.lengths = None if lengths is None else np.asarray(lengths, dtype=np.int64)
        self.groups = None if groups is None else np.asarray(groups, dtype=np.int64)
        self.batch_size = batch_size
        self.name = SHUFFLED if lengths is None else name

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The dataset indices of one epoch, in training order."""
        rng = np.random.default_rng([self.seed, epoch, 104729])
        perm = rng.permutation(self.size)
        if self.lengths is None:
            return perm
        if self.name == GROUPED:
            return group_by_length(perm, self.lengths, self.batch_size, rng)
        return spread_by_length(perm, self.lengths, self.batch_size, rng, self.groups)

    def __call__(self, position: int) -> tuple[int, int]:
        epoch, offset = divmod(position, self.size)
        if epoch != self._epoch:
            self._perm, self._epoch = self.epoch_order(epoch), epoch
        return int(self._perm[offset]), epoch


def use_threads(num_threads: int) -> None:
    """Apply ``train.num_threads`` (0: torch's default) to this process. The Trainer calls it,
    so every training run honours the setting; commands that compute before building their
    Trainer (a teacher labelling the transfer set) call it first themselves. On a shared
    2-core machine two OpenMP threads per process wait on each other, so one thread per run
    is often several times faster."""
    if num_threads:
        torch.set_num_threads(num_threads)


def example_lengths(data):
    """The tokens of each training example where the data knows them (fine-tuning), else None."""
    return data.lengths() if callable(getattr(data, "lengths", None)) else None


def example_groups(data):
    """Which training examples share a text (one paragraph's questions) where the data says, else None."""
    return data.groups() if callable(getattr(data, "groups", None)) else None


class TrainingInterrupted(EmberError):
    """SIGTERM/SIGINT arrived: the step finished, a checkpoint was written, training stopped."""


class Trainer:
    def __init__(
        self,
        module: nn.Module,
        data,
        cfg: TrainConfig,
        run_dir: str | Path,
        dist_info: DistInfo = DistInfo(),
        evaluate: Callable[[nn.Module], dict] | None = None,
        best_metric: str | None = None,
        on_best: Callable[[nn.Module, dict], None] | None = None,
        progress: bool = True,
        lr_scale: Callable[[str], float] | None = None,
        before_step: Callable[[int], None] | None = None,
        patience: int = 0,
    ) -> None:
        """``lr_scale(param_name)``: per-parameter lr multiplier (layer-wise decay).
        ``before_step(step)``: called before each optimizer step's forward passes; it must be a
        pure function of the step (e.g. gradual unfreezing) so resumed runs stay exact.
        ``patience``: stop after that many evaluations without a better ``best_metric``.
        """
        check_train_settings(cfg)
        # Grouping batches by length and cutting them into micro-batches both need a loss that is one
        # term per example (a per-token loss averages over a batch's tokens) and known lengths.
        self.lengths = example_lengths(data)
        self.loss_per_example = getattr(module, "loss_per_example", False)
        known = self.loss_per_example and self.lengths is not None and len(self.lengths) > 0
        longest = int(max(self.lengths)) if known else 0
        self.automatic_layout = longest > 0 and chose_no_layout(cfg)
        # On a CPU, micro-batches of at most train.micro_batch_tokens where the user chose no layout;
        # grad_accum for this world size (train.micro_batch_size), lr for the batch (train.lr_scaling)
        cfg = effective_config(cpu_micro_batches(cfg, dist_info.world_size, longest), dist_info.world_size)
        self.cfg, self.dist = cfg, dist_info
        use_threads(cfg.num_threads)
        if dist_info.is_main:
            check_speed(cfg.device, cfg.dtype)  # bf16 on a CPU without AMX: say so before hours pass
        # freed memory kept for the next step, within a bound when step sizes vary (host_memory.py)
        kept = cfg.keep_host_memory and cfg.device.startswith("cpu") and keep_freed_host_memory()
        if kept:
            # What an earlier run in this process freed (a sweep's trials, a notebook's runs) goes
            # back first: kept, it would count in this run's baseline and the cap would ratchet
            # up run after run (a BERT-grid sweep process: 6.7 GB while fine-tuning MiniLM on RTE)
            return_freed_host_memory()
        self.memory_cap = KeptMemoryCap() if kept else None
        self.run_dir = Path(run_dir)
        self.module = module.to(cfg.device)
        # train.parallel=fsdp: parameters sharded in place, before the optimizer sees them
        self.sharded = shard(self.module, cfg, dist_info)
        self.data = data
        self.evaluate, self.best_metric, self.on_best = evaluate, best_metric, on_best
        self.progress = progress and dist_info.is_main
        self.micro_batch = cfg.batch_size // (cfg.grad_accum * dist_info.world_size)  # checked by world_layout
        if self.automatic_layout and cfg.grad_accum > 1 and dist_info.is_main:
            print(f"note: each batch of {cfg.batch_size} runs as {cfg.grad_accum} micro-batches of {self.micro_batch} "
                  f"(at most {self.micro_batch * longest} tokens, train.micro_batch_tokens="
                  f"{cfg.micro_batch_tokens}): the same gradient in less memory; train.micro_batch_size sets another",
                  file=sys.stderr)
        self.before_step, self.patience = before_step, patience
        self.optimizer = build_optimizer(self.module, cfg, lr_scale)
        self.order = self.data_order()
        self.step = 0
        self.elapsed = 0.0  # training seconds over all sessions of this run
        self.tokens = 0  # non-padding tokens trained on, over all sessions and ranks
        self.best = {"value": None, "step": None}
        self.bad_evals = 0  # evaluations since the best one (early stopping)
        self.stopped_early = False
        self.stop_requested = False
        self.hardware = hardware(cfg.device)  # what trained it, for the run's model card (ember.interop.model_card)

    # -- state ----------------------------------------------------------------------------
    def trainer_state(self) -> dict:
        return {"step": self.step, "elapsed": self.elapsed, "tokens": self.tokens, "best": self.best,
                "world_size": self.dist.world_size, "seed": self.cfg.seed, "hardware": self.hardware,
                "micro_batches": self.cfg.grad_accum * self.dist.world_size,
                "bad_evals": self.bad_evals, "stopped_early": self.stopped_early, "data_order": self.order.name}

    def data_order(self, name: str | None = None):
        """The order examples are trained in: length-grouped batches where ``train.group_by_length``
        asks for them for this module (``wants_length_groups``) and the data knows its examples'
        lengths (fine-tuning), else a plain shuffle per epoch; ``name`` asks for one of
        the orders (a resumed checkpoint's: SHUFFLED, GROUPED or SPREAD)."""
        grouped = wants_length_groups(self.cfg.group_by_length, self.module) if name is None else name != SHUFFLED
        kind = SPREAD if name is None or name == SHUFFLED else name
        if hasattr(self.data, "data_order"):  # data with its own order (a task mixture, ember.train.mixture)
            return self.data.data_order(self.cfg.seed, bool(grouped and self.lengths is not None), self.cfg.batch_size,
                                        kind)
        return DataOrder(len(self.data), self.cfg.seed, self.lengths if grouped else None, self.cfg.batch_size,
                         example_groups(self.data), kind)

    def save(self) -> None:
        try:
            if self.cfg.parallel == "fsdp":  # every rank writes its shard (ember.train.sharded_checkpoint)
                save_sharded_checkpoint(self.run_dir, self.step, self.module, self.optimizer, self.trainer_state(),
                                        self.cfg.keep_checkpoints, self.dist)
                return
            if self.dist.is_main:
                ckpt.save_checkpoint(self.run_dir, self.step, self.module.state_dict(),
                                     self.optimizer.state_dict(), self.trainer_state(),
                                     keep=self.cfg.keep_checkpoints)
        except OSError as exc:  # a full disk or a file-size limit mid-save: say so, name what is kept
            raise ckpt.write_failure(exc, self.run_dir, self.step) from exc
        barrier(self.dist)

    def resume(self) -> bool:
        # either layout, into a whole or a sharded model; rank 0 picks the checkpoint
        found = resume_checkpoint(self.run_dir, self.module, self.optimizer, self.dist)
        if found is None:  # nothing saved yet (e.g. a restarted job): steps logged so far are redone
            if self.dist.is_main:
                MetricsLogger.truncate(self.run_dir / "metrics.jsonl", 0)
            return False
        path, state = found
        self.keep_layout(state)
        self.keep_data_order(state)
        self.step, self.elapsed, self.best = state["step"], state["elapsed"], state["best"]
        self.tokens = state.get("tokens", 0)  # absent in checkpoints written before it was counted
        self.bad_evals, self.stopped_early = state.get("bad_evals", 0), state.get("stopped_early", False)
        if self.dist.is_main:  # rank 0 alone writes the log, so it alone cuts it
            MetricsLogger.truncate(self.run_dir / "metrics.jsonl", self.step)
            print(f"resumed from {path} (step {self.step})")
        return True

    def keep_data_order(self, state: dict) -> None:
        """A run resumes in the order it started with (checkpoints written before batches could be
        length-grouped have no "data_order": they were shuffled), so its steps replay exactly."""
        was = state.get("data_order", SHUFFLED)
        if was not in (SHUFFLED, GROUPED, SPREAD):
            raise EmberError(f"the checkpoint's batches were {was!r}, an order this version of ember does not "
                             "know; resume it with the ember version that wrote it")
        if was != self.order.name:
            self.order = self.data_order(was)
            if self.order.name != was:  # grouped, but this data cannot say its examples' lengths
                raise EmberError(f"the checkpoint's batches were {was}, which this run's data cannot "
                                 "reproduce; resume it with the data and task it started with")
            if self.dist.is_main:
                print(f"note: the checkpoint's batches were {was}; the run goes on that way so it resumes "
                      "exactly (train.group_by_length applies to new runs)")

    def keep_layout(self, state: dict) -> None:
        """A run whose layout ember chose (CPU micro-batches, ``cpu_micro_batches``) resumes with its
        checkpoint's, so one written before that choice existed, or under another
        ``train.micro_batch_tokens``, replays exactly. Otherwise say so when a run resumes with
        another micro-batch layout: same examples per step, but masks and dropout are keyed by
        micro-batch, so the losses differ from an uninterrupted run (train.micro_batch_size keeps
        the layout across world sizes)."""
        was = state.get("micro_batches")
        now = self.cfg.grad_accum * self.dist.world_size
        if (self.automatic_layout and was is not None and was != now and was % self.dist.world_size == 0
                and self.cfg.batch_size % was == 0):
            self.cfg = dataclasses.replace(self.cfg, grad_accum=was // self.dist.world_size)
            self.micro_batch = self.cfg.batch_size // was
            if self.dist.is_main:
                print(f"note: the checkpoint was written with {was} micro-batch(es) per step; the run goes on "
                      "that way so it resumes exactly", file=sys.stderr)
            return
        if was is not None and was != now and self.dist.is_main:
            print(f"note: the checkpoint was written with {was} micro-batches per step, this run uses {now} "
                  f"({self.dist.world_size} rank(s) x grad_accum {self.cfg.grad_accum}); the data order is the "
                  "same, the random masks are not. Set train.micro_batch_size to keep the layout.", file=sys.stderr)

    def model_state(self) -> dict:
        """The whole model's weights on rank 0 (a collective when sharded: every rank calls it)."""
        return full_model_state(self.module)

    # -- one optimizer step ---------------------------------------------------------------
    def _micro_batches(self, step: int) -> list[list]:
        g, r, m = self.cfg.batch_size, self.dist.rank, self.micro_batch
        start = step * g + r * m * self.cfg.grad_accum
        batches = []
        for k in range(self.cfg.grad_accum):
            examples = []
            for pos in range(start + k * m, start + (k + 1) * m):
                index, epoch = self.order(pos)
                examples.append(self.data.example(index, epoch))
            batches.append(examples)
        return batches

    def train_step(self, model: nn.Module) -> tuple[dict, int]:
        cfg, step = self.cfg, self.step
        started = step_clock(cfg.clock)()
        sums: dict[str, list[float]] = {}
        tokens = 0
        micro = self._micro_batches(step)
        if self.before_step is not None:
            self.before_step(step)
        if cfg.dropout_off_fraction and step >= dropout_off_step(cfg):  # a function of the step: resumes exactly
            switch_off_dropout(self.module)
        for k, examples in enumerate(micro):
            # Keyed by the micro-batch's global index, so W ranks x A accumulation steps draw
            # the same corruption as 1 rank x (W*A) steps: the layout does not change results.
            micro_index = self.dist.rank * cfg.grad_accum + k
            rng = np.random.default_rng([cfg.seed, step, micro_index])
            torch.manual_seed(int(np.random.SeedSequence([cfg.seed, step, micro_index]).generate_state(1)[0]))
            batch = {n: t.to(cfg.device) for n, t in self.module.make_batch(examples, rng).items()}
            tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else 0
            sync = gradient_sync(model, k == len(micro) - 1 or not self.dist.enabled)
            with sync, autocast_context(cfg.device, cfg.dtype):
                loss, metrics = model(batch)
                (loss / cfg.grad_accum).backward()
            for name, (total, count) in metrics.items():
                acc = sums.setdefault(name, [0.0, 0.0])
                acc[0] += total
                acc[1] += count
        if not math.isfinite(loss.item()):
            raise EmberError(f"loss became {loss.item()} at step {step}; lower train.lr or check the data")
        if cfg.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(self.module.parameters(), cfg.max_grad_norm)
        # schedule "time" reads the training seconds so far, this step's included; rank 0's
        # clock sets it for every rank (each applying its own rate would split the replicas)
        lr = cfg.lr * lr_factor(step, cfg, self.elapsed + step_clock(cfg.clock)() - started)
        if cfg.schedule == "time":
            lr = agree([lr], [], self.dist)[0][0]
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        names = sorted(sums)
        flat = all_reduce_sums([v for n in names for v in sums[n]] + [float(tokens)], self.dist)
        result = {n: flat[2 * i] / max(flat[2 * i + 1], 1) for i, n in enumerate(names)}
        result["lr"] = lr
        return result, int(flat[-1])

    # -- the loop -------------------------------------------------------------------------
    def train(self, resume: bool = False) -> dict:
        if resume:
            self.resume()
        cfg = self.cfg  # after resume: a resumed run may keep its checkpoint's micro-batch layout
        model = self.module
        if self.dist.enabled and not self.sharded:
            model = nn.parallel.DistributedDataParallel(self.module)
        if cfg.compile:
            # A compiled wrapper for the training steps only: self.module keeps its parameter
            # names for checkpoints, and evaluation runs it uncompiled (eval shapes vary).
            model = torch.compile(model)
        from ember.train.wandb_run import options as wandb_options

        logger = MetricsLogger(self.run_dir, enabled=self.dist.is_main, trackers=cfg.trackers,
                               tracking_uri=cfg.tracking_uri, experiment=cfg.experiment, wandb=wandb_options(cfg))
        bar = self._progress_bar()
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def request_stop(signum, frame):  # finish the step, save, then exit cleanly
            self.stop_requested = True

        for s in previous:
            signal.signal(s, request_stop)
        self.module.train()
        last_metrics: dict = {}
        clock = step_clock(cfg.clock)
        completed = False
        try:
            while True:
                # Under DDP every rank leaves at the same step: rank 0's elapsed time decides the
                # budget (each rank's own clock would not), a signal to any rank stops them all.
                (self.elapsed,), (self.stop_requested,) = agree([self.elapsed], [self.stop_requested], self.dist)
                if self.step >= cfg.max_steps or self.stop_requested or self.stopped_early:
                    break
                if cfg.max_time and self.elapsed >= cfg.max_time:
                    break
                started = clock()
                metrics, tokens = self.train_step(model)
                seconds = clock() - started
                self.elapsed += seconds
                self.step += 1
                self.tokens += tokens
                if self.memory_cap is not None:
                    self.memory_cap.after_step()
                metrics["tokens_per_s"] = tokens / max(seconds, 1e-9)
                last_metrics = metrics
                if bar is not None:
                    bar.update(min(seconds, bar.total - bar.n) if cfg.max_time else 1)
                    bar.set_postfix(step=self.step, loss=f"{metrics['loss']:.3f}",
                                    tok_s=f"{metrics['tokens_per_s']:.0f}", lr=f"{metrics['lr']:.2e}", refresh=False)
                if self.step % cfg.log_every == 0 or self.step == 1:
                    logger.log(self.step, "train", metrics, self.elapsed)
                if self.evaluate and cfg.eval_every and self.step % cfg.eval_every == 0:
                    self.run_evaluation(logger)
                if cfg.save_every and self.step % cfg.save_every == 0:
                    self.save()
            if self.evaluate and (not cfg.eval_every or self.step % cfg.eval_every):
                self.run_evaluation(logger)
            if not cfg.save_every or self.step % cfg.save_every:
                self.save()
            completed = not self.stop_requested
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if bar is not None:
                bar.close()
            logger.close(stopped=not completed)
        if self.stop_requested:
            # A stopped run is not a finished one: callers must not write final weights or
            # results (a compare or a script would take them for complete).
            raise TrainingInterrupted(
                f"stopped by a signal at step {self.step}; the checkpoint is saved in "
                f"{self.run_dir}/checkpoints - continue with --resume"
            )
        return {"step": self.step, "elapsed": self.elapsed, "tokens": self.tokens, "best": self.best,
                "train": last_metrics, "stopped_early": self.stopped_early}

    def _progress_bar(self):
        """tqdm over the steps; over the time budget when there is one (``--max-time``), which
        usually ends the run long before max_steps, so its "left" is the budget's, not the
        recipe's step count's. None without progress."""
        if not self.progress:
            return None
        from tqdm import tqdm

        cfg = self.cfg
        if cfg.max_time:
            return tqdm(total=float(cfg.max_time), initial=min(self.elapsed, cfg.max_time), dynamic_ncols=True,
                        mininterval=1.0, bar_format="{l_bar}{bar}| {elapsed}<{remaining} of the time budget{postfix}")
        return tqdm(total=cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True, mininterval=1.0)

    def run_evaluation(self, logger: MetricsLogger) -> dict:
        metrics = {}
        if self.dist.is_main or self.sharded:  # a sharded model's forward needs every rank
            self.module.eval()
            with torch.no_grad(), autocast_context(self.cfg.device, self.cfg.dtype):
                metrics = self.evaluate(self.module)
            self.module.train()
            logger.log(self.step, "eval", metrics, self.elapsed)  # a no-op off rank 0
            if self.best_metric is not None:
                value = metrics[self.best_metric]
                if self.best["value"] is None or value > self.best["value"]:
                    self.best = {"value": value, "step": self.step}
                    self.bad_evals = 0
                    if self.on_best is not None:
                        self.on_best(self.module, metrics)
                else:
                    self.bad_evals += 1
                    # Early stopping (patience): the best weights are already kept by on_best.
                    # Only "early" when steps remain (the last evaluation ends the run anyway).
                    self.stopped_early = (bool(self.patience) and self.bad_evals >= self.patience
                                          and self.step < self.cfg.max_steps)
            tell_evaluation(self.run_dir, self.step, metrics, self.best_metric)  # e.g. a sweep's pruner
        if self.dist.enabled:  # every rank must leave the loop together
            self.stopped_early = all_reduce_sums([float(self.stopped_early)], self.dist)[0] > 0
        barrier(self.dist)
        return metrics


def dropout_off_step(cfg) -> int:
    """The first step trained without dropout: the last ``train.dropout_off_fraction`` of
    ``max_steps`` (BART §5.1: the final 10%). A run stopped earlier by ``max_time`` never gets there."""
    return math.ceil(cfg.max_steps * (1.0 - cfg.dropout_off_fraction))


def epoch_schedule(cfg: TrainConfig, n_examples: int, epochs: float) -> tuple[TrainConfig, int]:
    """(``cfg`` with max_steps for ``epochs`` passes over ``n_examples``, steps per epoch).

    Evaluation and checkpoints default to once per epoch (``eval_every``/``save_every`` 0), as
    BERT's fine-tuning keeps the best epoch on dev. Shared by every runner that counts in epochs:
    fine-tuning, task distillation, ELMo feature models."""
    import dataclasses

    steps_per_epoch = math.ceil(n_examples / cfg.batch_size)
    return dataclasses.replace(cfg, max_steps=max(1, int(round(epochs * steps_per_epoch))),
                               eval_every=cfg.eval_every or steps_per_epoch,
                               save_every=cfg.save_every or steps_per_epoch), steps_per_epoch
