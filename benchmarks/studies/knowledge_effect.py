"""Does knowledge help a real pre-trained encoder? all-MiniLM-L6-v2 fine-tuned on SST-2 and
CoNLL-2003 NER without knowledge, with K-BERT's injected WordNet triples (Liu et al. 2020) and
with ERNIE's entity fusion of TransE embeddings (Zhang et al. 2019), several seeds, dev and test.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/studies/knowledge_effect.py \\
        --out runs/knowledge-effect --seeds 1,2,3 --cpu-time --train-limit 8000

Steps (each skipped when its output exists, so re-running resumes where it stopped):
1. ``ember convert --from-hf`` the checkpoint into OUT/minilm;
2. ``ember kg build --wordnet DIR`` -> OUT/kg/wordnet.tsv (or --graph FILE), and for the ERNIE
   variants ``ember kg embed`` -> OUT/kg/transe (or --entities DIR);
3. (variant ``ernie-dea`` only) ``ember pretrain --recipe ernie-dea`` from OUT/minilm on --dea-data;
4. ``ember.finetune`` per task, variant and seed into OUT/runs/TASK/VARIANT/seed-N, then the test
   score of its best-on-dev weights: CoNLL-2003's own test split; SST-2 has no labelled test
   set here, so its dev set is split in two by a hash of each sentence: one half selects the
   best epoch ("dev"), the other is scored once at the end ("test");
5. OUT/table.md, OUT/table.json and OUT/knowledge_effect.png (``_knowledge_report``).

Variants: baseline (no knowledge), kbert (--knowledge graph), ernie (--entities), kbert+ernie,
ernie-dea (fusion pre-trained with dEA first). CPU time: --train-limit, --eval-limit (first N
dev/test sentences), --epochs, --max-length, --max-time per run, --cpu-time (one thread, CPU
clock). KagNet (Lin et al. 2019) is not here: it needs commonsense QA data (CommonsenseQA) and
ConceptNet, neither of which is in the data folder (docs/knowledge.md).
--smoke: everything on a few sentences, the committed WordNet sample and a 1-epoch TransE (CI).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import machine, sst2_dev_halves  # noqa: E402
from _knowledge_report import render_markdown, summarize, write_chart  # noqa: E402

import ember  # noqa: E402
from ember.cli import main as ember_cli  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.paths import data_root  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "kg" / "wordnet-sample.tsv"
VARIANTS = ("baseline", "kbert", "ernie", "kbert+ernie", "ernie-dea")
METRIC = {"sst2": "accuracy", "conll2003": "f1"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None, help="HF checkpoint folder (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--wordnet", default="/usr/share/wordnet", help="WordNet 3.0 database folder")
    p.add_argument("--graph", help="a triples file to use instead of building WordNet's")
    p.add_argument("--relations", help="K-BERT: only these relations (comma-separated)")
    p.add_argument("--max-triples", type=int, default=2, help="K-BERT's k")
    p.add_argument("--entities", help="entity embeddings to use instead of training TransE on the graph")
    p.add_argument("--transe-epochs", type=int, default=50)
    p.add_argument("--transe-dim", type=int, default=100)
    p.add_argument("--fusion-layers", type=int, default=0, help="ERNIE: top layers fused (0 = half)")
    p.add_argument("--tasks", default="sst2,conll2003")
    p.add_argument("--variants", default="baseline,kbert,ernie", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--train-limit", type=int, default=8000, help="training sentences per task (0 = all)")
    p.add_argument("--eval-limit", type=int, default=0, help="first N dev / test sentences (0 = all)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-time", type=float, default=0.0, help="seconds of training per run (0 = no limit)")
    p.add_argument("--cpu-time", action="store_true", help="one thread; budgets on this process's CPU clock")
    p.add_argument("--dea-data", default=None, help="ernie-dea: raw text (default: DATA/wiki-en/AA)")
    p.add_argument("--dea-steps", type=int, default=1000)
    p.add_argument("--smoke", action="store_true", help="a few sentences of everything (CI)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS] + [t for t in args.tasks if t not in METRIC]
    if unknown:
        raise EmberError(f"unknown variant/task {unknown}; variants: {', '.join(VARIANTS)}; tasks: {', '.join(METRIC)}")
    if args.smoke:
        args.seeds, args.train_limit, args.eval_limit, args.epochs = args.seeds[:1], 32, 16, 1.0
        args.max_length, args.batch_size, args.graph = 48, 8, args.graph or str(SAMPLE)
        args.transe_epochs, args.transe_dim, args.dea_steps = 1, 16, 2
    return args


def quiet_cli(argv: list[str]) -> str:
    """Run an ember verb, keeping its printout for the log; an error stops the benchmark."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = ember_cli(argv)
    if code:
        raise EmberError(f"`ember {' '.join(argv)}` failed ({code}): {buffer.getvalue()[-500:]}")
    return buffer.getvalue()


def prepare_inputs(args, out: Path) -> dict:
    """The imported checkpoint, the graph, the entity embeddings (and the dEA run)."""
    ckpt = Path(args.checkpoint) if args.checkpoint else data_root() / "checkpoints" / "all-MiniLM-L6-v2"
    init = out / "minilm"
    if not (init / "model.safetensors").is_file():
        print(quiet_cli(["convert", "--from-hf", str(ckpt), "--out", str(init)]).strip())
    graph = Path(args.graph) if args.graph else out / "kg" / "wordnet.tsv"
    if not graph.is_file():
        print(quiet_cli(["kg", "build", "--wordnet", args.wordnet, "--out", str(graph)]).strip())
    entities = Path(args.entities) if args.entities else out / "kg" / "transe"
    if any("ernie" in v for v in args.variants) and not (entities / "embeddings.safetensors").is_file() \
            and not args.entities:
        embed = ["kg", "embed", str(graph), "--out", str(entities), "--epochs", str(args.transe_epochs),
                 "--dim", str(args.transe_dim)]
        print(quiet_cli(embed).strip().splitlines()[-1])
    dea = out / "ernie-dea"
    if "ernie-dea" in args.variants and not (dea / "model.safetensors").is_file():
        ember.pretrain("ernie-dea", dea, data=args.dea_data or data_root() / "wiki-en" / "AA", resume=dea.is_dir(),
                       progress=False, overrides=[f"knowledge.init={init}", f"knowledge.entities={entities}",
                                                  f"train.max_steps={args.dea_steps}"] + clock(args))
    return {"init": init, "graph": graph, "entities": entities, "dea": dea, "checkpoint": ckpt}


def clock(args) -> list[str]:
    return ["train.clock=cpu", "train.num_threads=1"] if args.cpu_time else []


def conll_root(out: Path, limit: int) -> Path | None:
    """A data root whose CoNLL-2003 dev/test hold their first ``limit`` sentences (None: all)."""
    if not limit:
        return None
    root = out / "data" / "root"
    for name in ("train.txt", "dev.txt", "test.txt"):
        text = (data_root() / "conll2003" / name).read_text(encoding="utf-8")
        blocks = text.split("\n\n") if name == "train.txt" else text.split("\n\n")[:limit]
        atomic_write_text(root / "conll2003" / name, "\n\n".join(blocks).rstrip("\n") + "\n\n")
    return root


@contextlib.contextmanager
def data_root_at(root: Path | None):
    """EMBER_DATA pointed at ``root`` for the duration (None: unchanged)."""
    saved = os.environ.get("EMBER_DATA")
    if root is not None:
        os.environ["EMBER_DATA"] = str(root)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("EMBER_DATA", None)
        else:
            os.environ["EMBER_DATA"] = saved


def variant_settings(variant: str, paths: dict, args) -> tuple[Path, dict]:
    """(init, finetune keyword settings) of a variant."""
    settings = {}
    if "kbert" in variant:
        settings.update(knowledge=str(paths["graph"]), max_triples=args.max_triples)
        if args.relations:
            settings["relations"] = args.relations
    if "ernie" in variant:
        settings.update(entities=str(paths["entities"]), fusion_layers=args.fusion_layers)
    return (paths["dea"] if variant == "ernie-dea" else paths["init"]), settings


def run_one(task: str, variant: str, seed: int, args, paths: dict, halves, out: Path) -> dict:
    run = out / "runs" / task / variant / f"seed-{seed}"
    record_path = run / "record.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    init, settings = variant_settings(variant, paths, args)
    if task == "sst2":
        settings["eval_split"] = str(halves[0])
    start = time.process_time()
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):  # the knowledge line is on stderr
        result = ember.finetune(task, run, init=str(init), seeds=[seed], train_limit=args.train_limit or None,
                                lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, max_length=args.max_length,
                                overrides=clock(args) + ([f"train.max_time={args.max_time}"] if args.max_time else []),
                                resume=(run / "checkpoints").is_dir(), overwrite=not (run / "checkpoints").is_dir(),
                                progress=False, **settings)
        metric = METRIC[task]
        if task == "sst2":
            test = ember.evaluate(run, file=halves[1])["metrics"][metric]
        else:
            test = result.result["other_splits"]["test"][metric]
    knowledge = [line for line in log.getvalue().splitlines() if line.startswith("knowledge (")]
    record = {"task": task, "variant": variant, "seed": seed, "run": str(run),
              "scores": {"dev": result.metrics[metric], "test": test}, "cpu_seconds": time.process_time() - start,
              "knowledge_train": knowledge[0] if knowledge else ""}
    atomic_write_text(record_path, json.dumps(record, indent=2))
    print(f"{task} {variant} seed {seed}: dev {record['scores']['dev']:.4f} test {test:.4f} "
          f"({record['cpu_seconds']:.0f} CPU s)")
    return record


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(machine())
    paths = prepare_inputs(args, out)
    halves = sst2_dev_halves(out, args.eval_limit) if "sst2" in args.tasks else None
    root = conll_root(out, args.eval_limit) if "conll2003" in args.tasks else None
    records = []
    for task in args.tasks:
        with data_root_at(root if task == "conll2003" else None):
            for variant in args.variants:
                for seed in args.seeds:
                    records.append(run_one(task, variant, seed, args, paths, halves, out))
    meta = {"checkpoint": paths["checkpoint"].name, "machine": machine(), "seeds": args.seeds,
            "variants": args.variants, "train_limit": args.train_limit, "epochs": args.epochs, "lr": args.lr,
            "max_length": args.max_length, "graph": str(paths["graph"]), "max_triples": args.max_triples,
            "entities": str(paths["entities"]), "smoke": args.smoke}
    knowledge = {f"{r['task']}/{r['variant']}": r["knowledge_train"] for r in records
                 if r["knowledge_train"] and r["seed"] == args.seeds[0]}
    result = {"meta": meta, "records": records, "table": summarize(records), "knowledge": knowledge}
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    markdown = render_markdown(result)
    atomic_write_text(out / "table.md", markdown)
    write_chart(result, out / "knowledge_effect.png")
    print(markdown)
    return result


if __name__ == "__main__":
    try:
        main()
    except EmberError as exc:
        print(f"knowledge_effect: error: {exc}", file=sys.stderr)
        sys.exit(1)
