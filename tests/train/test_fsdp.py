"""FSDP under torchrun (2 gloo ranks on CPU): the losses of 1 process, sharded checkpoints that
resume exactly on 2, 1 or 2 ranks again, final weights gathered from the shards, and a full disk
or a `kill -9` on one rank in the middle of a sharded save."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch
from dist_helpers import (
    ONE_PROCESS,
    assert_same_losses,
    kill_one_rank_after_checkpoint,
    pretrain,
    pretrain_command,
    run_bounded,
    run_ok,
    torchrun,
    torchrun_with_fault_at_save,
)
from run_helpers import env, kill_after_checkpoint, saved_steps, train_losses

from ember.runs.checkpoint import list_checkpoints, load_weights, verify_checkpoint
from ember.runs.sharded import is_sharded
from ember.train.logging import MetricsLogger

FSDP = "train.parallel=fsdp"
STEPS = 15


@pytest.fixture(scope="module")
def one_process(wiki_prepared, tmp_path_factory):
    """The reference: 1 process, plain (unsharded) model, 2 micro-batches of 4 per step."""
    run = tmp_path_factory.mktemp("one") / "run"
    return run, pretrain(ONE_PROCESS, wiki_prepared, run, STEPS)


def assert_same_weights(run_a, run_b, atol=1e-5):
    a, b = load_weights(run_a / "model.safetensors"), load_weights(run_b / "model.safetensors")
    assert set(a) == set(b)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol, rtol=0), name


def assert_same_weights_to_rounding(run_a, run_b, rel=2e-4):
    """Each tensor of ``run_a`` within ``rel`` of ``run_b``'s in norm (||a - b|| / ||b||).

    For Adafactor (T5), whose eps1 = 1e-30 lets a near-zero gradient element take a full-sized
    step: there the last bits in which a sharded run's gradients differ (see the T5 test) grow
    to ~1e-4 in single weights by step 6, spread over many tensors, while each tensor stays
    within 4e-5 of the 1-process one in norm (19 fresh tokenizations, BENCHMARKS.md). The bound
    sits 5x above that and 3x below the least a 10% larger learning rate moves any tensor of this
    run (6.6e-4): a shard updated from its own rank's gradient or statistics would stand out."""
    a, b = load_weights(run_a / "model.safetensors"), load_weights(run_b / "model.safetensors")
    assert set(a) == set(b)
    for name in a:
        apart = float((a[name] - b[name]).norm() / b[name].norm())
        assert apart <= rel, (name, apart)


@pytest.fixture(scope="module")
def fsdp_run(wiki_prepared, tmp_path_factory):
    """bert on 2 ranks under FSDP, same settings as ``one_process``."""
    run = tmp_path_factory.mktemp("fsdp") / "run"
    return run, pretrain(torchrun(2), wiki_prepared, run, STEPS, FSDP)


def test_fsdp_bert_two_ranks_match_one_process(one_process, fsdp_run):
    (reference, losses), (run, fsdp) = one_process, fsdp_run
    assert_same_losses(fsdp, losses)
    assert losses[STEPS] < losses[1] - 0.1  # it trains
    checkpoints = list_checkpoints(run)
    assert [c.name for c in checkpoints] == ["step-00000012", "step-00000015"]  # keep_checkpoints=2
    for c in checkpoints:  # each rank wrote its own shard
        assert is_sharded(c) and (c / "__0_0.distcp").is_file() and (c / "__1_0.distcp").is_file()
    assert_same_weights(run, reference)  # gathered from the shards, on rank 0


@pytest.mark.slow
def test_convert_and_export_read_a_sharded_checkpoint_directly(fsdp_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fsdp_run[0], run)
    last = list_checkpoints(run)[-1]
    # `ember convert --to-hf` of the sharded checkpoint: the final step's weights
    run_ok(ONE_PROCESS + ["convert", "--to-hf", str(last), "--out", str(tmp_path / "hf-ckpt")])
    run_ok(ONE_PROCESS + ["convert", "--to-hf", str(run), "--out", str(tmp_path / "hf-final")])
    assert_same_weights(tmp_path / "hf-ckpt", tmp_path / "hf-final", atol=0)
    # `ember export` of a run that has only (sharded) checkpoints: its newest one, verified
    (run / "model.safetensors").unlink()
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("The river flows north.\nA city was founded in 1850.\n")
    done = run_ok(ONE_PROCESS + ["export", str(run), "--format", "hf", "--out", str(tmp_path / "export"),
                                 "--verify-file", str(sentences)])
    assert last.name in done.stderr
    assert_same_weights(tmp_path / "export", tmp_path / "hf-final", atol=0)
    # a checkpoint with a missing shard is refused by name, nothing written
    (last / "__1_0.distcp").unlink()
    done = subprocess.run(ONE_PROCESS + ["convert", "--to-hf", str(last), "--out", str(tmp_path / "hf-bad")],
                          env=env(), capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "the shard __1_0.distcp of rank 1 is missing" in done.stderr
    assert not (tmp_path / "hf-bad").exists()


@pytest.mark.slow
def test_fsdp_electra_two_ranks_match_one_process(wiki_prepared, tmp_path):
    # two backbones sharing their embeddings: the shared tables stay in the outer FSDP unit
    sets = ["electra.generator_size=0.5", "train.max_steps=6"]
    one = pretrain(ONE_PROCESS, wiki_prepared, tmp_path / "one", 6, *sets, recipe="electra-mini")
    fsdp = pretrain(torchrun(2), wiki_prepared, tmp_path / "fsdp", 6, FSDP, *sets, recipe="electra-mini")
    assert_same_losses(fsdp, one)
    assert_same_weights(tmp_path / "fsdp", tmp_path / "one")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["albert-mini", "xlnet-mini"])
def test_fsdp_albert_and_xlnet_two_ranks_match_one_process(recipe, wiki_prepared, tmp_path):
    # ALBERT: the shared layer makes the encoder one unit; XLNet: one unit per two-stream layer
    one = pretrain(ONE_PROCESS, wiki_prepared, tmp_path / "one", 6, recipe=recipe)
    assert_same_losses(pretrain(torchrun(2), wiki_prepared, tmp_path / "fsdp", 6, FSDP, recipe=recipe), one)
    assert_same_weights(tmp_path / "fsdp", tmp_path / "one")


@pytest.mark.slow
def test_fsdp_gpt2_two_ranks_match_one_process(wiki_bpe, tmp_path):
    # a decoder: one FSDP unit per pre-LN block, tied input/output embedding in the outer unit
    one = pretrain(ONE_PROCESS, wiki_bpe, tmp_path / "one", 6, recipe="gpt2-tiny")
    assert_same_losses(pretrain(torchrun(2), wiki_bpe, tmp_path / "fsdp", 6, FSDP, recipe="gpt2-tiny"), one)
    assert_same_weights(tmp_path / "fsdp", tmp_path / "one")


@pytest.mark.slow
def test_fsdp_t5_two_ranks_match_one_process(wiki_t5_prepared, tmp_path):
    # encoder and decoder stacks: one unit per block, each stack's shared position bias outside.
    # At step 1 the decoder's gradients are bit-identical on 1 process and 2 ranks; the encoder's
    # differ in the last bits (its output feeds every decoder block's cross-attention, and those
    # contributions are summed in another order when FSDP runs the blocks' backward). Adafactor
    # (T5's optimizer) amplifies that on some tokenizations (the fixture's unigram training is not
    # deterministic), so the weights are compared per tensor in norm, not element by element.
    one = pretrain(ONE_PROCESS, wiki_t5_prepared, tmp_path / "one", 6, recipe="t5-tiny")
    assert_same_losses(pretrain(torchrun(2), wiki_t5_prepared, tmp_path / "fsdp", 6, FSDP, recipe="t5-tiny"), one)
    assert_same_weights_to_rounding(tmp_path / "fsdp", tmp_path / "one")


@pytest.mark.slow
def test_fsdp_lamb_trust_ratio_uses_whole_layer_norms(wiki_prepared, tmp_path):
    # each rank holds half of every tensor: a ratio from the local shard would differ
    sets = ["train.optimizer=lamb", "train.lr=2e-2", "train.weight_decay=0.01"]
    one = pretrain(ONE_PROCESS, wiki_prepared, tmp_path / "one", 6, *sets)
    assert_same_losses(pretrain(torchrun(2), wiki_prepared, tmp_path / "fsdp", 6, FSDP, *sets), one)
    assert_same_weights(tmp_path / "fsdp", tmp_path / "one")


@pytest.mark.slow
def test_sharded_checkpoint_killed_rank_resumes_on_one_process_then_on_two_ranks(one_process, wiki_prepared, tmp_path):
    """The state is addressed by parameter name, not by rank: a run whose rank 1 is SIGKILLed
    after the checkpoint of step 3 continues on 1 process, which is killed after step 9 and
    continued on 2 ranks; every logged loss is the uninterrupted run's (micro-batches of 4)."""
    _, losses = one_process
    run = tmp_path / "run"
    killed = kill_one_rank_after_checkpoint(pretrain_command(torchrun(2), wiki_prepared, run, STEPS, FSDP), run, 3)
    assert killed.returncode != 0 and not (run / "model.safetensors").exists()  # killed mid-run
    kill_after_checkpoint(pretrain_command(ONE_PROCESS, wiki_prepared, run, STEPS, FSDP, resume=True), run, 9)  # 2 -> 1
    newest = max(saved_steps(run))  # 9 or, on a busy machine, a later one
    assert is_sharded(run / "checkpoints" / f"step-{newest:08d}")  # the single process writes the same layout
    assert_same_losses(pretrain(torchrun(2), wiki_prepared, run, STEPS, FSDP, resume=True), losses)  # 1 -> 2


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_a_killed_rank_with_no_lost_or_repeated_step(one_process, wiki_prepared,
                                                                                   tmp_path):
    """torchrun restarts both workers after rank 1 is SIGKILLed past step 3; they resume from
    the newest checkpoint (TORCHELASTIC_RESTART_COUNT > 0) and the log holds each step once,
    with the uninterrupted run's loss."""
    _, losses = one_process
    run = tmp_path / "run"
    cmd = pretrain_command(torchrun(2, "--max-restarts=1"), wiki_prepared, run, STEPS, FSDP)
    job = kill_one_rank_after_checkpoint(cmd, run, 3)
    assert job.returncode == 0, job.output[-3000:]
    assert "resumed from" in job.output
    steps = [r["step"] for r in MetricsLogger.read(run / "metrics.jsonl") if r["split"] == "train"]
    assert steps == list(range(1, STEPS + 1))  # none lost, none repeated
    assert_same_losses(train_losses(run), losses)


def assert_only_the_checkpoint_of(run, step: int) -> None:
    """The run's one listed checkpoint is ``step``'s, complete and matching its manifest."""
    assert [c.name for c in list_checkpoints(run)] == [f"step-{step:08d}"]
    assert verify_checkpoint(list_checkpoints(run)[0]) is None
    assert not (run / "model.safetensors").exists()


def died(output: str, rank: int) -> bool:
    """torchrun's report names ``rank`` as SIGKILLed (exit code -9)."""
    return re.search(rf"rank\s*:\s*{rank} \(local_rank: {rank}\)\s+exitcode\s*:\s*-9\b", output) is not None


@pytest.mark.slow
def test_fsdp_full_disk_on_one_rank_mid_save_keeps_the_last_checkpoint_and_resume_matches(one_process, wiki_prepared,
                                                                                          tmp_path):
    """Rank 1 alone reaches a file-size limit (RLIMIT_FSIZE, as a full disk) writing its shard of
    the step-6 checkpoint while rank 0 writes its own: the run stops (no rank waits for the other)
    with one line naming the cause, the rank and the file; nothing of step 6 is left; the step-3
    checkpoint is intact, and --resume from it reproduces the uninterrupted run's losses."""
    _, losses = one_process
    run, tmp = tmp_path / "run", tmp_path / "run" / "checkpoints" / ".step-00000006.tmp"
    done = run_bounded(pretrain_command(torchrun_with_fault_at_save(tmp_path, "full-disk", at=2, rank=1),
                                        wiki_prepared, run, STEPS, FSDP))
    assert done.returncode != 0, done.stdout[-3000:]
    # Each rank ended itself (rank 0 did not wait for rank 1). Counted by occurrence, not by line:
    # torchrun's own output from the other worker may land inside a line.
    errors = re.findall(r"ember pretrain: error: .*?continue with --resume", done.stdout)
    assert len(errors) == 2, done.stdout[-3000:]
    for line in errors:
        assert f"could not write the checkpoint of step 6 in {run / 'checkpoints'}: a file-size limit" in line
        assert f"on rank 1, writing {tmp / '__1_0.distcp'}" in line and "step-00000003 is intact" in line
    assert not re.search(r"\[rank\d\]:\s*Traceback", done.stdout)  # no worker traceback (DCP's exception)
    assert_only_the_checkpoint_of(run, 3)
    assert not list((run / "checkpoints").glob(".step-*"))  # the half-written save was removed
    resumed = run_ok(pretrain_command(torchrun(2), wiki_prepared, run, STEPS, FSDP, resume=True))
    assert f"resumed from {run / 'checkpoints' / 'step-00000003'}" in resumed.stdout
    assert_same_losses(train_losses(run), losses)


@pytest.mark.slow
def test_fsdp_kill_9_of_either_rank_mid_save_keeps_the_last_checkpoint_and_resume_matches(one_process, wiki_prepared,
                                                                                         tmp_path):
    """Rank 1 is SIGKILLed halfway through writing its shard of the step-6 checkpoint: rank 0
    does not publish it or wait, it stops saying the ranks lost contact (torchrun names rank 1),
    and only step 3 is listed. The --resume from step 3 then loses rank 0 - the one that
    publishes - halfway through its own step-6 save, leaving a temporary folder that is never
    taken for a checkpoint; a second --resume replaces it and reproduces the uninterrupted losses."""
    _, losses = one_process
    run, tmp = tmp_path / "run", tmp_path / "run" / "checkpoints" / ".step-00000006.tmp"
    lost = f"could not finish the checkpoint of step 6 in {run / 'checkpoints'}: the ranks lost contact mid-save"
    first = run_bounded(pretrain_command(torchrun_with_fault_at_save(tmp_path, "kill", at=2, rank=1),
                                         wiki_prepared, run, STEPS, FSDP))
    assert first.returncode != 0 and died(first.stdout, rank=1), first.stdout[-3000:]
    assert lost in first.stdout and "step-00000003 is the newest checkpoint" in first.stdout, first.stdout[-3000:]
    assert_only_the_checkpoint_of(run, 3)
    assert not tmp.exists()  # rank 0 removed what the ranks had written

    second = run_bounded(pretrain_command(torchrun_with_fault_at_save(tmp_path, "kill", at=1, rank=0),
                                          wiki_prepared, run, STEPS, FSDP, resume=True))
    assert second.returncode != 0 and died(second.stdout, rank=0), second.stdout[-3000:]
    assert f"resumed from {run / 'checkpoints' / 'step-00000003'}" in second.stdout and lost in second.stdout
    assert_only_the_checkpoint_of(run, 3)
    assert (tmp / "__1_0.distcp").is_file()  # rank 1's shard: written, never published

    third = run_ok(pretrain_command(torchrun(2), wiki_prepared, run, STEPS, FSDP, resume=True))
    assert f"resumed from {run / 'checkpoints' / 'step-00000003'}" in third.stdout
    assert_same_losses(train_losses(run), losses)
    assert not list((run / "checkpoints").glob(".step-*"))
