"""pretrain_profile.py's --smoke-sized run (a step put in buckets by kind of work, fp32 and bf16)
and pretrain_throughput.py's useful-FLOP count against a hand count."""

from __future__ import annotations

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)


def test_pretrain_profile_buckets_a_step_and_names_the_matmuls():
    bench = load_benchmark("pretrain_profile")
    assert bench.bucket("mkldnn::_linear_pointwise") == bench.bucket("aten::addmm") == "matmuls"
    assert bench.bucket("aten::_log_softmax_backward_data") == "head and loss"
    assert bench.bucket("aten::native_layer_norm_backward") == "norms"
    assert bench.bucket("aten::gelu_backward") == "activation" and bench.bucket("aten::ge") == "dropout"
    table = bench.main(["--preset", "bert-tiny", "--batch", "2", "--length", "16", "--steps", "1"])
    assert set(table) == {"ember", "transformers (masked rows)"}
    assert all(side["matmuls"] > 0 for side in table.values())
    bf16 = bench.main(["--preset", "bert-tiny", "--batch", "2", "--length", "16", "--steps", "1", "--bf16"])
    # autocast casts every weight to bf16 and its gradient back: both sides convert dtypes
    assert all(side["dtype conversions"] > 0 and side["matmuls"] > 0 for side in bf16.values())


def test_useful_flops_count_matches_a_hand_count_for_one_layer():
    bench = load_benchmark("pretrain_throughput")
    from ember.config import ModelConfig

    cfg = ModelConfig(vocab_size=10, hidden_size=4, num_layers=2, num_heads=1, intermediate_size=8)
    # first layer, per token: QKV 2*4*12 + out 2*4*4 + FFN 2*(4*8 + 8*4) = 96 + 32 + 128 = 256;
    # attention 2 * (2 * T * H) per token with T = 3: 48; x 3 tokens (1 x 3 batch) = 912.
    # last layer: keys and values at the 3 tokens 3 * 2*4*8 = 192, the rest at the 1 masked row
    # (query 32 + out 32 + FFN 128 + attention 48) = 240, so 432;
    # head at 1 masked row: 2 * (4*4 + 4*10) = 112; forward 1456, training step x3
    assert bench.useful_flops(cfg, 1, 3, 1) == 3 * 1456
