"""benchmarks/speed/row_kernels.py's --smoke mode: every one-row kernel runs on weights in huge
pages and reports a rate (not a measurement)."""

from __future__ import annotations

import json

from benchmark_helpers import keep_torch_threads, load_benchmark  # noqa: F401 (an autouse fixture)

from ember import host_blas


def test_row_kernels_smoke_reports_every_kernel_for_both_layouts(tmp_path):
    bench = load_benchmark("row_kernels")
    out = tmp_path / "rows.json"
    results = bench.main(["--smoke", "--json", str(out)])
    expected = {"mkl_cols", "mkl_rows", "sum"} | ({"openblas_cols", "openblas_rows"} if host_blas.available() else set())
    assert [(r["k"], r["n"]) for r in results] == list(bench.SMOKE_SHAPES)
    for result in results:
        assert set(result["gb_per_s"]) == expected and all(rate > 0 for rate in result["gb_per_s"].values())
    assert json.loads(out.read_text()) == results
