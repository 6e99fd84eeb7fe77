"""Checkpoint folders and their manifest (ember.runs.checkpoint), in seconds and without a
training run: what a save writes and keeps, every way verification tells a damaged checkpoint
from an intact one, which checkpoint a resume picks, and the message of a failed save. The
training-run versions (kill -9 / full disk mid-save, then --resume) are in tests/train and
tests/objectives."""

from __future__ import annotations

import errno
import hashlib
import json

import pytest
import torch

from ember.errors import EmberError
from ember.runs.checkpoint import (
    list_checkpoints,
    load_latest_checkpoint,
    newest_checkpoint,
    save_checkpoint,
    verify_checkpoint,
    write_failure,
)

FILES = ("model.safetensors", "optimizer.pt", "trainer_state.json")


def _save(run, step: int, keep: int = 2):
    model = {"w": torch.full((3, 2), float(step)), "b": torch.arange(4.0)}
    optimizer = {"state": {0: {"exp_avg": torch.ones(3) * step}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    return save_checkpoint(run, step, model, optimizer, {"step": step, "losses": [1.5, 1.25]}, keep=keep)


def test_checkpoint_manifest_lists_each_files_size_and_sha256(tmp_path):
    tmp_path = tmp_path / "runs" / "new"  # a save makes the folders it needs
    path = _save(tmp_path, 7)
    assert path == tmp_path / "checkpoints" / "step-00000007"
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest) == sorted(FILES)
    for name in FILES:
        data = (path / name).read_bytes()
        assert manifest[name] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert verify_checkpoint(path) is None
    found, model, optimizer, trainer = load_latest_checkpoint(tmp_path)
    assert found == path and trainer == {"step": 7, "losses": [1.5, 1.25]}
    assert torch.equal(model["w"], torch.full((3, 2), 7.0)) and torch.equal(optimizer["state"][0]["exp_avg"], torch.ones(3) * 7)


def test_checkpoint_save_keeps_the_newest_and_clears_half_written_folders(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    stale = tmp_path / "checkpoints" / ".step-00000004.x.tmp"  # what a kill -9 mid-save leaves
    stale.mkdir()
    (tmp_path / "checkpoints" / "step-notes.txt").write_text("a file, not a checkpoint")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    _save(tmp_path, 3, keep=1)  # the same step again replaces it; keep=1 drops step 2
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003"] and not stale.exists()
    for step in (4, 5, 6):
        _save(tmp_path, step, keep=0)  # keep=0: every checkpoint stays
    assert len(list_checkpoints(tmp_path)) == 4
    assert list_checkpoints(tmp_path / "elsewhere") == []


@pytest.mark.parametrize("damage, message", [
    ("no-manifest", "manifest.json is missing"),
    ("bad-manifest", "manifest.json is unreadable"),
    ("missing", "optimizer.pt is missing"),
    ("longer", "optimizer.pt has {n} bytes, the manifest says {m}"),
    ("flipped", "optimizer.pt does not match its SHA-256"),
])
def test_checkpoint_verify_names_what_is_wrong(tmp_path, damage, message):
    path = _save(tmp_path, 1)
    target = path / "optimizer.pt"
    size = target.stat().st_size
    if damage == "no-manifest":
        (path / "manifest.json").unlink()
    elif damage == "bad-manifest":
        (path / "manifest.json").write_text('{"model.safetensors": ')
    elif damage == "missing":
        target.unlink()
    elif damage == "longer":
        target.write_bytes(target.read_bytes() + b"\0")
    else:  # the same size, one byte changed: only the hash can tell
        data = bytearray(target.read_bytes())
        data[size // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    assert verify_checkpoint(path).startswith(message.format(n=size + 1, m=size))


def test_checkpoint_verify_names_the_rank_of_a_missing_shard(tmp_path):
    path = tmp_path / "step-00000001"
    path.mkdir()
    (path / "__1_0.distcp").write_bytes(b"x")
    (path / "manifest.json").write_text(json.dumps({
        "__1_0.distcp": {"bytes": 1, "sha256": hashlib.sha256(b"x").hexdigest()},
        "__12_0.distcp": {"bytes": 1, "sha256": hashlib.sha256(b"x").hexdigest()}}))
    assert verify_checkpoint(path) == "the shard __12_0.distcp of rank 12 is missing"


def test_checkpoint_resume_takes_the_newest_intact_one(tmp_path, capsys):
    assert newest_checkpoint(tmp_path) is None and load_latest_checkpoint(tmp_path) is None
    first, second, third = (_save(tmp_path, step, keep=0) for step in (1, 2, 3))
    (third / "model.safetensors").write_bytes(b"truncated")
    found, value = newest_checkpoint(tmp_path, lambda path: path.name)
    assert (found, value) == (second, "step-00000002")
    assert f"checkpoint {third} is damaged: model.safetensors has 9 bytes" in capsys.readouterr().err

    def unreadable_second(path):  # verified but unreadable counts as damaged too
        if path == second:
            raise ValueError("bad pickle")
        return path.name

    assert newest_checkpoint(tmp_path, unreadable_second) == (first, "step-00000001")
    assert "cannot be read (bad pickle)" in capsys.readouterr().err
    (first / "manifest.json").unlink()
    with pytest.raises(EmberError, match="no intact checkpoint") as err:
        newest_checkpoint(tmp_path, unreadable_second)
    assert str(err.value).count("is damaged") == 3 and "--overwrite" in str(err.value)


@pytest.mark.parametrize("code, reason", [(errno.ENOSPC, "the disk is full"),
                                          (errno.EFBIG, "a file-size limit (ulimit -f) was reached"),
                                          (errno.EDQUOT, "the disk quota is used up"),
                                          (errno.EIO, "the file system refused a write")])
def test_checkpoint_write_failure_says_why_and_what_is_left(tmp_path, code, reason):
    error = write_failure(OSError(code, "text of the OS"), tmp_path, 5)
    assert f"step 5 in {tmp_path / 'checkpoints'}: {reason} (text of the OS)" in str(error)
    assert "no earlier checkpoint exists yet" in str(error)
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    assert "step-00000004 is intact" in str(write_failure(OSError(code, "x"), tmp_path, 6))


def test_checkpoint_optimizer_file_is_read_as_weights_only(tmp_path):
    """A resume reads optimizer.pt with torch.load(weights_only=True): a file that would unpickle
    an arbitrary object (here a Fraction; in an attack, code) is refused even when its manifest
    was rewritten to match, instead of being run."""
    from fractions import Fraction

    from ember.runs.checkpoint import read_checkpoint

    path = _save(tmp_path, 1)
    torch.save({"state": {}, "param_groups": [], "extra": Fraction(1, 3)}, path / "optimizer.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        read_checkpoint(path)


def test_checkpoint_cleanup_that_fails_neither_fails_the_save_nor_hides_its_error(tmp_path, monkeypatch):
    """Deleting old, stale or half-written folders is best effort: a file that cannot be deleted
    (a permission, a busy network file) leaves it behind, but a finished save still succeeds and
    a failed save still raises its own error (a full disk), not the cleanup's."""
    import os

    import ember.runs.checkpoint as checkpoint

    _save(tmp_path, 1)
    _save(tmp_path, 2)
    (tmp_path / "checkpoints" / ".step-00000003.x.tmp").mkdir()
    (tmp_path / "checkpoints" / ".step-00000003.x.tmp" / "optimizer.pt").write_bytes(b"half")
    real_unlink = os.unlink

    def undeletable_optimizer_state(path, *args, **kwargs):
        if os.path.basename(path) == "optimizer.pt":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", undeletable_optimizer_state)
    third = _save(tmp_path, 3, keep=2)  # step 1 and the stale folder cannot be removed completely
    assert verify_checkpoint(third) is None
    assert (tmp_path / "checkpoints" / "step-00000001" / "optimizer.pt").exists()

    def full_disk(obj, fh):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "torch_save", full_disk)
    with pytest.raises(OSError) as err:
        _save(tmp_path, 4)
    assert err.value.errno == errno.ENOSPC


def test_a_real_file_size_limit_comes_out_of_both_writers_as_the_os_error(tmp_path):
    """Under a real file-size limit (RLIMIT_FSIZE, as a full disk) safetensors reports the OS error
    only in its message and torch.save turns it into "unexpected pos"; both writers raise the
    OSError itself (EFBIG, with the file), which the checkpoint's one-line message is built from."""
    import resource

    from ember.runs.checkpoint import save_weights, torch_save

    big = {"w": torch.zeros(4096)}  # 16 KiB, over the limit below
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, limits[1]))  # Python ignores SIGXFSZ: writes fail
    try:
        with pytest.raises(OSError) as weights_err:
            save_weights(big, tmp_path / "model.safetensors")
        with open(tmp_path / "optimizer.pt", "wb") as fh, pytest.raises(OSError) as save_err:
            torch_save(big, fh)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert weights_err.value.errno == errno.EFBIG and save_err.value.errno == errno.EFBIG
