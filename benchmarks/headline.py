"""The headline table for the machine it runs on: ember against its reference on each kind of
work, as ratios of alternated repetitions in one process (> 1: ember ahead), one thread, CPU time.

    HF_HUB_OFFLINE=1 PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/headline.py \\
        [--quick] [--only pretrain finetune embed family generation serving] [--json out.json]

Full size takes ~15 CPU-minutes (one thread; the wall time grows with the machine's load);
``--quick`` runs every section at its script's ``--smoke`` size (seconds each: a check that the
table is made, not a measurement). The table is printed as Markdown under a header naming the
date, CPU model, cores, threads, clock and the load averages (os.getloadavg) at start and end;
each section's own report (the scripts' usual output) goes to ``--log`` (default: a file in
the temporary folder, named at the end).

Every row comes from an existing script's ``main`` (nothing is timed here), called with the
arguments in the table's last column:

  pretrain    speed/pretrain_throughput.py: the bert-mini MLM step against the masked-rows loop
              (transformers with the head at the masked rows only) and against run_mlm's full head
  finetune    speed/finetune_throughput.py: the real all-MiniLM-L6-v2 fine-tuned on SST-2 against
              a plain transformers loop (whole runs, seeds alternated)
  embed       speed/embed_throughput.py: MiniLM fp32 sentence vectors against sentence-transformers'
              ``encode`` on STS-B dev and wiki-en
  family      speed/family_step.py: GPT-2, T5, BART and XLNet training steps against transformers
  generation  speed/generate_speed.py's ``generation_rows(quick)``, see below
  serving     speed/inference.py: the classification forward `ember serve` runs (fixed shapes,
              batch 32 x 128 and one 1 x 32 request) against transformers, fp32 and int8

The sections that read the real checkpoint (finetune, embed) need EMBER_DATA's
checkpoints/all-MiniLM-L6-v2 and say "skipped" without it; the run they need is converted once
into the temporary folder.

Generation: the coupling with the generation benchmark is one function. If ``generate_speed``
imports (benchmarks/speed/generate_speed.py), its ``generation_rows(quick: bool)`` must return
a list of dicts, each with ``work`` (str: what was decoded) and ``ratio`` (float: the
reference's time over ember's, > 1 = ember ahead), and optionally ``reference`` (str), ``each``
(list of per-repetition ratios) and ``detail`` (str, e.g. "tokens equal"). If the module or the
function is missing, the table says so in a row and the other sections still run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _folder in (HERE / "common", HERE / "speed"):  # the shared helpers and the scripts called
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _bench import load, machine  # noqa: E402

SECTIONS = ("pretrain", "finetune", "embed", "family", "generation", "serving")
SIZES = {"finetune_seeds": [1, 2]}  # --finetune-seeds: each seed is one ember and one transformers run
CHECKPOINT = ("checkpoints", "all-MiniLM-L6-v2")


def row(work: str, reference: str, ratio: float | None, each=(), detail: str = "", command: str = "") -> dict:
    return {"work": work, "reference": reference, "ratio": ratio, "each": [float(x) for x in each],
            "detail": detail, "command": command}


def _args(argv: list[str]) -> str:
    return " ".join(argv)


# -- the sections: each calls one script's main and reads its ratios -------------------------------


def pretrain_rows(quick: bool, work: Path) -> list[dict]:
    import pretrain_throughput

    argv = ["--cpu-time", "--cuda", "off"] + (["--smoke"] if quick else ["--presets", "bert-mini", "--repeats", "5"])
    (r,) = pretrain_throughput.main(argv)
    command = f"speed/pretrain_throughput.py {_args(argv)}"
    return [row(f"MLM pre-training step, {r['preset']}", "transformers, head at the masked rows",
                r["ratio_vs_masked"]["ember"], r["ratio_vs_masked_each"]["ember"],
                f"{100 * r['utilisation']['ember']:.0f}% of the fp32 matmul peak ({r['peak_gflops']:.0f} GFLOP/s)",
                command),
            row(f"MLM pre-training step, {r['preset']}", "transformers run_mlm (full-vocabulary logits)",
                r["ratio"]["ember"], detail="", command=command)]


def minilm_run(work: Path) -> tuple[Path, Path] | None:
    """(the checkpoint folder, the same as an ember run) or None when EMBER_DATA lacks it."""
    from ember.paths import data_root

    checkpoint = data_root().joinpath(*CHECKPOINT)
    if not (checkpoint / "config.json").is_file():
        return None
    run = work / "minilm"
    if not run.is_dir():
        from ember.interop.convert import import_hf

        import_hf(checkpoint, run)
    return checkpoint, run


def finetune_rows(quick: bool, work: Path) -> list[dict]:
    import finetune_throughput

    found = minilm_run(work)
    if found is None:
        return [row("fine-tuning all-MiniLM-L6-v2, SST-2", "plain transformers loop", None,
                    detail=f"skipped: no {'/'.join(CHECKPOINT)} under EMBER_DATA")]
    hf, run = found
    argv = ["--hf", str(hf), "--run", str(run), "--cpu-time", "--tasks", "sst2"]
    argv += ["--smoke"] if quick else ["--train-limit", "2000", "--seeds", *map(str, SIZES["finetune_seeds"])]
    s = finetune_throughput.main(argv)["tasks"]["sst2"]
    return [row(f"fine-tuning all-MiniLM-L6-v2, SST-2 ({'64' if quick else '2,000'} rows, 1 epoch)",
                "plain transformers loop, dynamic padding", s["ratio"], s["ratio_each"],
                f"dev accuracy {s['ember']['accuracy']:.2f} vs {s['transformers']['accuracy']:.2f}",
                f"speed/finetune_throughput.py {_args(argv[4:])}")]


def embed_rows(quick: bool, work: Path) -> list[dict]:
    import embed_throughput

    found = minilm_run(work)
    if found is None:
        return [row("MiniLM embeddings fp32", "sentence-transformers encode", None,
                    detail=f"skipped: no {'/'.join(CHECKPOINT)} under EMBER_DATA")]
    hf, run = found
    argv = ["--hf", str(hf), "--run", str(run), "--cpu-time", "--backends", "torch"]
    argv += ["--smoke"] if quick else ["--wiki-sentences", "1000", "--repeats", "3", "--latency-texts", "50"]
    r = embed_throughput.main(argv)
    rho = r["spearman"]["ember torch"] - r["spearman"][embed_throughput.REFERENCE]
    rows = []
    for corpus, c in r["corpora"].items():
        rows.append(row(f"MiniLM embeddings fp32, {corpus} ({c['texts']:,} texts)", "sentence-transformers encode",
                        c["ratio"]["ember torch"], c["ratio_each"]["ember torch"],
                        f"{c['texts_per_s']['ember torch']:,.0f} vs {c['texts_per_s'][embed_throughput.REFERENCE]:,.0f}"
                        f" texts/s; STS-B Spearman {rho:+.2f}", f"speed/embed_throughput.py {_args(argv[4:])}"))
    return rows


def family_rows(quick: bool, work: Path) -> list[dict]:
    import family_step

    argv = ["--cpu-time"] + (["--smoke"] if quick else ["--repeats", "3"])
    return [row(f"{r['family']} training step ({r['preset']}, batch {'x'.join(map(str, r['batch']))})",
                "transformers, same weights and batch", r["ratio_of_medians"], r["ratio_each"],
                f"loss before training {r['loss_ember']:.4f} vs {r['loss_transformers']:.4f}",
                f"speed/family_step.py {_args(argv)}")
            for r in family_step.main(argv)]


def generation_rows(quick: bool, work: Path) -> list[dict]:
    """``generate_speed.generation_rows(quick)`` (the contract: the module docstring), or one row
    saying what is missing."""
    missing = row("generation", "transformers generate", None,
                  detail="missing: benchmarks/speed/generate_speed.py with generation_rows(quick) "
                         "(issue 46 item 1) is not in this checkout")
    try:
        import generate_speed
    except ImportError:
        return [missing]
    produce = getattr(generate_speed, "generation_rows", None)
    if produce is None:
        return [missing]
    rows = []
    for r in produce(quick):
        rows.append(row(str(r["work"]), str(r.get("reference", "transformers generate")), float(r["ratio"]),
                        r.get("each", ()), str(r.get("detail", "")), "speed/generate_speed.py generation_rows"))
    return rows


def serving_rows(quick: bool, work: Path) -> list[dict]:
    import inference

    argv = ["--cpu-time"] + (["--smoke"] if quick else ["--preset", "bert-mini", "--repeats", "5"])
    r = inference.main(argv)
    rows = []
    for fixed in r["fixed"]:
        rates, each = fixed["sequences_per_s"], fixed["ratio_each"]
        what = "batch" if not fixed["shape"].startswith("1x") else "one request"
        for name in ("ember fp32", "ember int8"):
            rows.append(row(f"classification forward ({r['preset'] if not quick else 'smoke'}, {what} "
                            f"{fixed['shape']}), {name.split()[1]}", "transformers fp32 (SDPA)",
                            rates[name] / rates["reference fp32"], each[name],
                            f"{rates[name]:,.0f} vs {rates['reference fp32']:,.0f} sequences/s",
                            f"speed/inference.py {_args(argv)}"))
    return rows


RUNNERS = {"pretrain": pretrain_rows, "finetune": finetune_rows, "embed": embed_rows, "family": family_rows,
           "generation": generation_rows, "serving": serving_rows}


# -- the table -------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    size = "--quick: smoke sizes, not a measurement" if result["quick"] else "full size"
    lines = [f"Headline figures, {result['date']} ({size})",
             f"machine: {result['machine']}; clock: CPU time, the sides alternated in one process",
             f"load averages (1, 5, 15 min): {result['load_start'].removeprefix('load ')} at start, "
             f"{result['load_end'].removeprefix('load ')} at the end; "
             f"{result['cpu_minutes']:.1f} CPU-minutes, {result['wall_minutes']:.1f} minutes wall",
             "",
             "| work | reference | ember / reference | per repetition | detail | command (benchmarks/) |",
             "|---|---|---:|---|---|---|"]
    for r in result["rows"]:
        ratio = f"**{r['ratio']:.2f}x**" if r["ratio"] is not None else "-"
        each = " ".join(f"{x:.2f}" for x in r["each"])
        lines.append(f"| {r['work']} | {r['reference']} | {ratio} | {each} | {r['detail']} | "
                     f"{('`' + r['command'] + '`') if r['command'] else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every section at its --smoke size (seconds each)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--finetune-seeds", type=int, nargs="+", default=SIZES["finetune_seeds"],
                        help="fine-tuning seeds at full size (one seed: ~2 CPU-minutes; they alternate who runs first)")
    parser.add_argument("--log", help="where the sections' own reports go (default: a temporary file)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    SIZES["finetune_seeds"] = args.finetune_seeds
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only, never a download
    import torch

    torch.set_num_threads(1)
    log = Path(args.log) if args.log else Path(tempfile.mkstemp(prefix="ember-headline-", suffix=".log")[1])
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "quick": args.quick, "machine": machine(), "load_start": load(), "rows": [], "log": str(log)}
    cpu, wall = time.process_time(), time.perf_counter()
    print(f"{result['machine']}; {result['load_start']}; sections: {' '.join(args.only)}; log: {log}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ember-headline-") as tmp, open(log, "w", encoding="utf-8") as out:
        for name in args.only:
            start = time.process_time()
            print(f"  {name}... ", end="", flush=True)
            try:
                with contextlib.redirect_stdout(out):
                    rows = RUNNERS[name](args.quick, Path(tmp))
            except Exception as exc:  # one broken section must not lose the others' figures
                rows = [row(name, "", None, detail=f"failed: {type(exc).__name__}: {exc}")]
            finally:
                torch.set_num_threads(1)
            result["rows"] += rows
            print(f"{(time.process_time() - start) / 60:.1f} CPU-min; {load()}; "
                  + ", ".join(f"{r['ratio']:.2f}x" if r["ratio"] is not None else r["detail"][:60] for r in rows),
                  flush=True)
    result.update(load_end=load(), cpu_minutes=(time.process_time() - cpu) / 60,
                  wall_minutes=(time.perf_counter() - wall) / 60)
    print("\n" + markdown(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
