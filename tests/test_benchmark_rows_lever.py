"""benchmarks/speed/rows_lever.py's --smoke mode: the last-layer-at-rows lever per objective on real
batches runs and reports sane numbers (not a measurement)."""

from __future__ import annotations

import json

import pytest

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)


def test_rows_lever_smoke_times_bert_spanbert_and_xlm_on_real_batches(wiki_prepared, en_ru, tmp_path):
    bench = load_benchmark("rows_lever")
    out = tmp_path / "rows.json"
    results = bench.main(["--smoke", "--cpu-time", "--data", str(wiki_prepared), "--xlm-data", str(en_ru),
                          "--json", str(out)])
    by_name = {r["objective"]: r for r in results}
    assert set(by_name) == {"bert", "spanbert", "xlm"}
    for result in results:
        assert all(rate > 0 for rate in result["tokens_per_s"].values()) and len(result["ratio_each"]) == 2
    for name in ("spanbert", "xlm"):  # both also run their step as ember ran it before their heads were fused
        assert set(by_name[name]["tokens_per_s"]) == {"rows", "everywhere", "before"} and by_name[name]["ratio_vs_before"] > 0
    # BERT and XLM read their masked rows; SpanBERT reads those and its spans' boundaries besides
    assert by_name["bert"]["read"] == by_name["bert"]["masked"] and by_name["xlm"]["read"] == by_name["xlm"]["masked"]
    assert by_name["spanbert"]["read"] > by_name["spanbert"]["masked"]
    assert json.loads(out.read_text())[1]["read"] == by_name["spanbert"]["read"]
    with pytest.raises(bench.EmberError, match="needs --xlm-data"):
        bench.main(["--smoke", "--data", str(wiki_prepared), "--objectives", "xlm"])
