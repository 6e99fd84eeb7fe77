"""ember.train.precision: bf16 autocast is offered where it is fast; a bf16 run on a CPU without
AMX is warned before it starts, a float32 run on a CPU with AMX is told bf16 is faster there,
and GPUs are left alone."""

from __future__ import annotations

import pytest
import torch

from ember.errors import EmberError
from ember.train import precision
from ember.train.precision import autocast_context, check_speed


@pytest.mark.parametrize("amx", [True, False])
def test_bf16_on_a_cpu_warns_only_without_amx(monkeypatch, capsys, amx):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: amx)
    monkeypatch.setattr(precision, "_SAID", set())
    message = check_speed("cpu", "bfloat16")
    if amx:
        assert message is None and capsys.readouterr().err == ""
    else:
        assert "without AMX" in message and "--dtype float32" in message
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("device, dtype", [("cpu", "float32"), ("cuda", "bfloat16"), ("cuda:1", "bf16")])
def test_float32_and_gpu_runs_get_no_precision_warning(monkeypatch, device, dtype):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    assert check_speed(device, dtype) is None


@pytest.mark.parametrize("device, amx, noted", [("cpu", True, True), ("cpu", False, False), ("cuda", True, False)])
def test_float32_on_an_amx_cpu_is_told_bf16_is_faster(monkeypatch, capsys, device, amx, noted):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: amx)
    monkeypatch.setattr(precision, "_SAID", set())
    message = check_speed(device, "float32")
    if noted:
        assert message.startswith("note:") and "--dtype bfloat16" in message
        assert message in capsys.readouterr().err
        # said once per process: `ember glue` trains a run per task and seed in one
        assert check_speed(device, "float32") == message and capsys.readouterr().err == ""
    else:
        assert message is None and capsys.readouterr().err == ""


def test_cpu_bf16_probe_answers_with_a_bool():
    assert isinstance(precision.cpu_has_fast_bf16(), bool)


def test_autocast_context_casts_cpu_products_to_bf16_and_refuses_other_dtypes():
    x = torch.randn(4, 8)
    with autocast_context("cpu", "bfloat16"):
        assert (x @ x.t()).dtype == torch.bfloat16
    with autocast_context("cpu", "float32"):
        assert (x @ x.t()).dtype == torch.float32
    with pytest.raises(EmberError, match="choose float32 or bfloat16"):
        autocast_context("cpu", "int8")


def test_trainer_warns_of_slow_bf16_when_it_is_built(monkeypatch, capsys, tmp_path):
    from ember.config import TrainConfig
    from ember.train.loop import Trainer

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    Trainer(torch.nn.Linear(2, 2), list(range(4)), TrainConfig(dtype="bfloat16", batch_size=2), tmp_path,
            progress=False)
    assert "without AMX" in capsys.readouterr().err
