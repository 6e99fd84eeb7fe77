"""Sharded checkpoints (torch.distributed.checkpoint) in one process: exact resume of model and
optimizer, the manifest written last, a missing shard named, and the global batch refused
when the world size does not divide it. The multi-rank runs are in test_fsdp.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.config import TrainConfig
from ember.errors import EmberError
from ember.runs.checkpoint import list_checkpoints
from ember.runs.sharded import checkpoint_model_state, is_sharded
from ember.train import sharded_checkpoint
from ember.train.distributed import DistInfo
from ember.train.scaling import world_layout
from ember.train.sharded_checkpoint import resume_checkpoint, save_sharded_checkpoint


def trained(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A two-layer module after one AdamW step, so the optimizer holds moments to restore."""
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(4, 6)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return module, optimizer


def save(run, step, module, optimizer, keep=3):
    return save_sharded_checkpoint(run, step, module, optimizer, {"step": step}, keep, DistInfo())


def test_sharded_checkpoint_resume_restores_weights_and_adam_moments_exactly(tmp_path):
    module, optimizer = trained()
    path = save(tmp_path, 1, module, optimizer)
    assert is_sharded(path) and (path / "__0_0.distcp").is_file() and (path / "manifest.json").is_file()
    other, other_opt = trained(seed=1)  # different weights and moments, same shapes
    found = resume_checkpoint(tmp_path, other, other_opt, DistInfo())
    assert found == (path, {"step": 1})
    for (name, a), b in zip(module.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    for k, state in optimizer.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[key], other_opt.state_dict()["state"][k][key]), (k, key)
    # the weights read back whole in one process (what `ember convert`/`export` use)
    whole = checkpoint_model_state(path)
    assert set(whole) == set(module.state_dict())
    assert all(torch.equal(whole[n], t) for n, t in module.state_dict().items())


def test_sharded_checkpoint_manifest_written_last_so_a_killed_save_is_never_latest(tmp_path, monkeypatch):
    module, optimizer = trained()
    good = save(tmp_path, 1, module, optimizer)
    real_write = sharded_checkpoint.atomic_write_text

    def killed_before_manifest(path, text):
        if path.name == "manifest.json":
            raise KeyboardInterrupt  # the process dies with every shard already on disk
        real_write(path, text)

    monkeypatch.setattr(sharded_checkpoint, "atomic_write_text", killed_before_manifest)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, module, optimizer)
    assert list((tmp_path / "checkpoints").glob(".step-00000002.tmp/__0_0.distcp"))  # shards were written
    assert list_checkpoints(tmp_path) == [good]
    assert resume_checkpoint(tmp_path, *trained(seed=1), DistInfo())[0] == good
    monkeypatch.undo()  # the next attempt at the same step replaces the leftover
    assert save(tmp_path, 2, module, optimizer).name == "step-00000002"
    assert not list((tmp_path / "checkpoints").glob(".step-*"))


def test_sharded_checkpoint_missing_shard_is_named_and_the_previous_one_used(tmp_path, capsys):
    module, optimizer = trained()
    first = save(tmp_path, 1, module, optimizer)
    second = save(tmp_path, 2, module, optimizer)
    (second / "__0_0.distcp").unlink()
    assert resume_checkpoint(tmp_path, *trained(seed=1), DistInfo())[0] == first
    assert "the shard __0_0.distcp of rank 0 is missing" in capsys.readouterr().err
    with pytest.raises(EmberError, match="is damaged: the shard __0_0.distcp of rank 0 is missing"):
        checkpoint_model_state(second)
    (first / "__0_0.distcp").unlink()
    with pytest.raises(EmberError, match="no intact checkpoint") as err:
        resume_checkpoint(tmp_path, *trained(seed=1), DistInfo())
    assert "start over with --overwrite" in str(err.value)
    assert first.is_dir() and second.is_dir()  # nothing deleted: the user decides


def test_world_size_that_does_not_divide_the_global_batch_is_refused():
    cfg = TrainConfig(batch_size=12, micro_batch_size=4)
    assert world_layout(cfg, 1).grad_accum == 3 and world_layout(cfg, 3).grad_accum == 1
    with pytest.raises(EmberError, match="cannot be split evenly over 2 rank") as err:
        world_layout(cfg, 2)
    assert "divides 3" in str(err.value)
    with pytest.raises(EmberError, match="divisible by grad_accum x world size = 2 x 4"):
        world_layout(TrainConfig(batch_size=12, grad_accum=2), 4)


def test_pretrain_refuses_a_batch_the_ranks_cannot_split_before_writing_anything(wiki_prepared, tmp_path, capsys):
    from conftest import TINY_MODEL
    from ember.cli import main

    out = tmp_path / "run"
    args = ["pretrain", "--recipe", "bert-mini", "--data", str(wiki_prepared), "--out", str(out), "--max-steps", "2",
            "--no-progress"]
    for s in TINY_MODEL + ["train.batch_size=12", "train.micro_batch_size=5"]:
        args += ["--set", s]
    assert main(args) == 1
    assert "train.batch_size=12 is not a multiple of micro_batch_size x world size = 5 x 1" in capsys.readouterr().err
    assert not out.exists()


def test_sharded_checkpoint_full_disk_is_named_and_the_previous_one_kept(tmp_path):
    """A write refused by the file system (here a file-size limit, RLIMIT_FSIZE, as a full disk)
    comes out as one EmberError naming the cause and the shard file, although torch.save's own
    error has no errno; nothing of the failed save is left. The 2-rank case is in test_fsdp.py."""
    import resource

    module, optimizer = trained()
    good = save(tmp_path, 1, module, optimizer)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, limits[1]))  # each shard file here is larger
    try:
        with pytest.raises(EmberError) as err:
            save(tmp_path, 2, module, optimizer)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    shard = tmp_path / "checkpoints" / ".step-00000002.tmp" / "__0_0.distcp"
    assert str(err.value).startswith(f"could not write the checkpoint of step 2 in {tmp_path / 'checkpoints'}: "
                                     "a file-size limit (ulimit -f) was reached")
    assert f"on rank 0, writing {shard}" in str(err.value) and "step-00000001 is intact" in str(err.value)
    assert list_checkpoints(tmp_path) == [good] and not list((tmp_path / "checkpoints").glob(".step-*"))
    assert resume_checkpoint(tmp_path, *trained(seed=1), DistInfo())[0] == good
