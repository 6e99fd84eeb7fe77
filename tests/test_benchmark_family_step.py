"""benchmarks/speed/family_step.py --smoke: GPT-2, T5, BART and XLNet training steps, ember against
transformers from the same weights on the same batch. Not a measurement: it checks that the two
sides compute one loss before they are timed, and that the gate catches a difference."""

from __future__ import annotations

import json

import pytest
import torch

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)

pytest.importorskip("transformers")


def test_family_step_smoke_times_gpt2_t5_bart_and_xlnet_after_checking_both_sides_compute_one_loss(tmp_path):
    bench = load_benchmark("family_step")
    out = tmp_path / "r.json"
    results = bench.main(["--smoke", "--cpu-time", "--json", str(out)])
    assert [r["family"] for r in results] == ["gpt2", "t5", "bart", "xlnet"]
    for r in results:
        assert r["loss_ember"] == pytest.approx(r["loss_transformers"], abs=1e-4)
        assert r["loss_ember"] > 5  # a random model on a 500-word vocabulary: about ln(500) = 6.2
        assert set(r["tokens_per_s"]) == {"ember", "transformers"} and min(r["tokens_per_s"].values()) > 0
        assert len(r["ratio_each"]) == 2 and r["median_of_ratios"] > 0
    written = json.loads(out.read_text())
    assert written[3]["batch"] == [2, 32]
    assert written[2]["batch"][0] == 2 and written[2]["batch"][1] < 32  # BART: infilling shortens the input


@pytest.mark.parametrize("family", ["gpt2", "t5", "bart", "xlnet"])
def test_family_step_refuses_to_time_two_sides_that_compute_different_losses(family):
    bench = load_benchmark("family_step")
    torch.manual_seed(0)
    race = bench.RACES[family](*bench.SMOKE[family])
    bench.same_loss(race)  # the same weights through ember's interop: one loss
    with torch.no_grad():
        # the last layer's weight (BART's post-LN stacks absorb a change of an early one: its loss moves 1e-6)
        weight = [p for n, p in race.hf.named_parameters()
                  if p.ndim == 2 and p.shape[0] > 64 and "emb" not in n and "shared" not in n][-1]
        weight.add_(0.1 * torch.randn_like(weight))
    with pytest.raises(RuntimeError, match="do not compute the same step"):
        bench.same_loss(race)
