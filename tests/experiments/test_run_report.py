"""`ember report`: a pre-training run on real Wikipedia and fine-tuning seeds on real SST-2 read
back into one self-contained HTML page (its numbers checked against the run files), the page
rendered in headless Chromium, `ember glue`'s table linked to its report, the SVG charts' axes
(golden values), and bad input."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import torch

from browser_helpers import browser_or_skip
from conftest import TINY_MODEL, real_data
from run_helpers import SHORT_RUN

from ember.cli import main
from ember.errors import EmberError


@pytest.fixture(scope="module")
def runs(wiki_prepared, tmp_path_factory):
    """A 40-step bert-mini (tiny) with held-out evaluations and checkpoints, and SST-2 fine-tuned
    from it on 3 seeds (the ember.finetune seed layout: sst2/seed-N + summary.json)."""
    import ember

    real_data("glue", "SST-2")
    root = tmp_path_factory.mktemp("report")
    threads = torch.get_num_threads()
    try:
        ember.pretrain("bert-mini", root / "bert-mini", data=wiki_prepared, progress=False, overrides=TINY_MODEL + [
            *SHORT_RUN, "train.eval_every=20", "train.save_every=20", "train.log_every=2", "train.keep_checkpoints=2",
            "train.num_threads=1"])
        ember.finetune("sst2", root / "sst2", init=root / "bert-mini", seeds=[1, 2, 3], train_limit=160, epochs=2,
                       lr=2e-3, max_length=48, batch_size=16, progress=False, num_threads=1)
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def report(runs):
    out = runs / "report.html"
    assert main(["report", str(runs / "bert-mini"), str(runs / "sst2"), "--out", str(out)]) == 0
    return out


def test_report_holds_the_runs_numbers_and_nothing_from_elsewhere(runs, report):
    html = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)|@import|url\(|https?://|<script""", html)
    names = ["bert-mini", "sst2/seed-1", "sst2/seed-2", "sst2/seed-3"]
    for name in names:
        assert f'href="#run-{name.replace("/", "-")}"' in html and f'id="run-{name.replace("/", "-")}"' in html
    # Tokens seen: the trainer state of the newest checkpoint, as counted during training.
    state = json.loads((runs / "bert-mini" / "checkpoints" / "step-00000040" / "trainer_state.json").read_text())
    overview = re.search(r'<table class="overview">(.*?)</table>', html, re.S).group(1)
    first = re.search(r"<tr><td><a href=\"#run-bert-mini\">.*?</tr>", overview, re.S).group(0)
    assert f"{state['tokens'] / 1e3:.1f}k" in first and "<td class=\"num\">40</td>" in first
    assert "<td>bert-mini</td>" in first  # the recipe ember.pretrain was given (RUN/recipe.json)
    assert "train.keep_checkpoints=2" in html  # and its overrides
    # Both checkpoints are listed, complete; the prepared corpus's token count is shown.
    section = re.search(r'<section class="run" id="run-bert-mini">(.*?)</section>', html, re.S).group(1)
    listed = re.findall(r"<td>(step-\d+)</td>.*?<td>(\w+)</td></tr>", section)
    assert listed == [("step-00000020", "complete"), ("step-00000040", "complete")]
    from pathlib import Path

    from ember.runs.folder import load_run_config

    meta = json.loads((Path(load_run_config(runs / "bert-mini").data.prepared) / "meta.json").read_text())
    assert f"{meta['splits']['train']['num_tokens']:,}" in html and "wordpiece, 2000 tokens" in html
    # Held-out evaluations at steps 20 and 40, as in metrics.jsonl.
    evals = [json.loads(line) for line in (runs / "bert-mini" / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert [e["step"] for e in evals] == [20, 40] and f"mlm_loss {evals[-1]['mlm_loss']:.4g}" in html
    # Per-seed results with their spread: the mean and std summary.json has.
    summary = json.loads((runs / "sst2" / "summary.json").read_text())["metrics"]["accuracy"]
    table = re.search(r'<table class="seeds">(.*?)</table>', html, re.S).group(1)
    values = [float(v) for v in re.findall(r'<td class="num">([\d.]+)</td></tr>', table)]
    assert values[:3] == pytest.approx(summary["values"], abs=1e-4)
    assert values[3] == pytest.approx(summary["mean"], abs=1e-4)
    assert values[4] == pytest.approx(statistics.stdev(summary["values"]), abs=1e-4)
    # Charts: a training chart per metric, learning rate, throughput, the seeds' spread.
    for title in ("loss", "mlm_acc", "learning rate", "throughput", "main metric over seeds (mean and ± 1 std)"):
        assert f'aria-label="{title}"' in html, title
    assert "prepared" in html and "config.yaml" in html and "objective: bert" in html


def test_report_renders_in_chromium(report):
    from selenium.webdriver.common.by import By

    with browser_or_skip() as browser:
        browser.get(report.as_uri())
        assert browser.title == "ember report · 4 runs"
        charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
        assert len(charts) >= 10 and all(c.size["width"] > 400 and c.size["height"] > 200 for c in charts)
        loss = browser.find_element(By.CSS_SELECTOR, 'svg[aria-label="loss"]')
        assert len(loss.find_elements(By.CSS_SELECTOR, "polyline.series")) == 2  # training and held-out
        assert loss.find_elements(By.CSS_SELECTOR, "circle.point")
        browser.find_element(By.LINK_TEXT, "sst2/seed-2").click()
        section = browser.find_element(By.ID, "run-sst2-seed-2")
        assert "SST-2" in section.text and "seed" in section.text
        assert browser.execute_script("return window.scrollY") > 0


def test_one_report_per_run_without_out_and_bad_input(runs, tmp_path, capsys):
    assert main(["report", str(runs / "bert-mini")]) == 0
    page = (runs / "bert-mini" / "report.html").read_text()
    assert "ember report: bert-mini" in page and "Fine-tuning results per seed" not in page
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 1
    assert "holds no run folder (a folder with config.yaml)" in capsys.readouterr().err
    from ember.experiments.run_report import find_runs, write_report

    with pytest.raises(EmberError, match="is not a folder"):
        find_runs(tmp_path / "missing")
    # one path as a str is one run (it was read as a list of its characters: "r is not a folder")
    page = write_report(str(runs / "bert-mini"), tmp_path / "one.html").read_text()
    assert "ember report: bert-mini" in page


def test_glue_links_its_runs_table_to_the_report(runs):
    from ember.experiments.glue import run_glue

    out = runs / "glue"
    threads = torch.get_num_threads()
    try:
        run_glue(str(runs / "bert-mini"), out, tasks=["sst2"], seeds=[1, 2], train_limit=48, epochs=1,
                 max_length=32, num_threads=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    table = (out / "glue.md").read_text()
    assert "| [runs/sst2-seed1](report.html#run-sst2-seed1) |" in table and "[report.html](report.html)" in table
    html = (out / "report.html").read_text()
    assert 'id="run-sst2-seed1"' in html and 'id="run-sst2-seed2"' in html and "ember glue: bert-mini" in html


def test_seed_statistics_golden():
    from ember.experiments.report_page import _stat

    values = [0.5, 0.6, 0.7, None]  # a seed without a result does not count
    assert _stat(values, "mean") == pytest.approx(0.6) and _stat(values, "std") == pytest.approx(0.1)
    assert (_stat(values, "min"), _stat(values, "max")) == (0.5, 0.7) and _stat([0.5], "std") is None


def test_chart_axes_and_points_golden():
    from ember.experiments.svg_chart import HEIGHT, LEFT, RIGHT, WIDTH, Series, line_chart, nice_ticks

    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3.2, 7.9) == [4, 5, 6, 7]
    assert nice_ticks(0, 40) == [0, 10, 20, 30, 40]
    svg = line_chart("loss", [Series("a", [(0, 0.0), (10, 1.0)])], "step", "loss")
    # x: 0 -> LEFT, 10 -> WIDTH - RIGHT; y: 6% padding each side of [0, 1] over the plot's height.
    top, bottom = 30, HEIGHT - 46
    y = lambda v: bottom - (v + 0.06) / 1.12 * (bottom - top)  # noqa: E731
    points = re.search(r'<polyline class="series" points="([^"]+)"', svg).group(1)
    assert points == f"{LEFT:.1f},{y(0):.1f} {WIDTH - RIGHT:.1f},{y(1):.1f}"
