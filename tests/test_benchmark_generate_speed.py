"""benchmarks/speed/generate_speed.py run tiny: ember's decoding races transformers' `generate` for
every family and mode at equal tokens, and times `ember serve`'s /generate. Not a measurement."""

from __future__ import annotations

import json

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)


def test_generate_speed_smoke_races_every_family_and_mode_at_equal_tokens_and_times_serve(tmp_path):
    bench = load_benchmark("generate_speed")
    out = tmp_path / "g.json"
    results = bench.main(["--tiny", "--repeats", "1", "--serve", "--json", str(out)])
    races = [r for r in results if "serve" not in r]
    assert {(r["family"], r["batch"], r["mode"]) for r in races} == {
        (f, b, m) for f in ("gpt2", "t5", "bart") for b in (1, 8) for m in ("greedy", "sample", "beam4")
        if not (f == "gpt2" and m == "beam4")}  # ember has no GPT beam search
    assert all(r["tokens_equal"] for r in races)  # same weights, same procedure: same tokens
    assert all(r["ember_tok_s"] > 0 and r["speedup"] > 0 for r in races)
    (serve,) = [r["serve"] for r in results if "serve" in r]
    assert 0 < serve["ttft_ms_p50"] <= serve["ttft_ms_p99"] and serve["per_token_ms_p50"] <= serve["per_token_ms_p99"]
    assert json.loads(out.read_text())[0]["family"] == "gpt2"


def test_generation_rows_give_headline_the_goal_cases_at_equal_tokens():
    """The rows `benchmarks/headline.py` prints for generation: batch-1 greedy of GPT-2, T5 and BART
    and batch-8 beam search of the encoder-decoders, each a ratio at equal tokens."""
    rows = load_benchmark("generate_speed").generation_rows(True)
    assert [r["work"].split(" (")[0] + (" beam" if "beam4" in r["work"] else "") for r in rows] == [
        "gpt2", "t5", "t5 beam", "bart", "bart beam"]
    assert all(r["ratio"] > 0 and r["detail"].endswith("tokens equal") for r in rows)
    assert all(("batch 1 greedy" in r["work"]) != ("batch 8 beam4" in r["work"]) for r in rows)
