"""train.dtype=float16 is refused (ember does no loss scaling): the message points to bfloat16,
and nothing is written."""

from __future__ import annotations

import pytest

import ember
from ember.config import TrainConfig
from ember.errors import EmberError


@pytest.mark.parametrize("dtype", ["float16", "fp16", "FP16", "half"])
def test_train_config_refuses_fp16_and_names_bfloat16(dtype):
    with pytest.raises(EmberError, match=r"needs loss scaling.*use train.dtype=bfloat16"):
        TrainConfig(dtype=dtype)
    assert TrainConfig(dtype="bfloat16").dtype == "bfloat16"


def test_pretrain_and_finetune_refuse_fp16_before_writing(wiki_prepared, tmp_path, capsys):
    from ember.cli import main

    out = tmp_path / "pretrain"
    assert main(["pretrain", "--recipe", "bert-mini", "--data", str(wiki_prepared), "--out", str(out),
                 "--set", "train.dtype=float16"]) == 1
    assert "use train.dtype=bfloat16" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(EmberError, match="bfloat16"):
        ember.finetune("sst2", tmp_path / "ft", model="bert-tiny", tokenizer=str(wiki_prepared / "tokenizer.json"),
                       dtype="float16", progress=False)
    assert not (tmp_path / "ft").exists()
