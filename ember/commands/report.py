"""`ember report`: a self-contained HTML page to read a run (or to compare several)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="write an HTML page that shows a run (or compares several)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read run folders and write one self-contained HTML file (inline charts, no "
        "external files: it opens offline and can be mailed): settings (config.yaml, the recipe), "
        "data and tokens seen, loss and metric curves with the held-out evaluations, learning rate, "
        "throughput over time, fine-tuning results per seed with their spread, and the checkpoints. "
        "RUN may be a run folder or a folder of runs (the OUT of `ember finetune --seeds`, `ember "
        "compare`, `ember glue`). Without --out each RUN gets RUN/report.html; with --out, one page "
        "shows every run given, side by side.\n\n"
        "example:\n  ember report runs/bert-mini\n"
        "  ember report runs/bert-mini runs/electra-mini --out runs/pretraining.html")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder(s), or folders of runs")
    p.add_argument("--out", help="one HTML file for all RUNs (default: RUN/report.html for each)")
    p.add_argument("--title", help="the page's title (default: the run's name or the number of runs)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from ember.experiments.run_report import write_report

    if args.out:
        print(f"wrote {write_report(args.runs, args.out, args.title)}")
        return 0
    for run_dir in args.runs:
        print(f"wrote {write_report([run_dir], Path(run_dir) / 'report.html', args.title)}")
    return 0
