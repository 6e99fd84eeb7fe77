"""SQuAD over whole articles: sliding windows against a Longformer and a BigBird that read the
article in one pass (issue 42 item 7; Beltagy et al. 2020 §4, Zaheer et al. 2020 §4).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/long_squad.py \\
        --out runs/long-squad --seeds 1,2,3

The data folder's SQuAD 2.0 dev half (16 articles) is split by article as ``--task squad``
splits it (a quarter for dev); only answerable questions are kept (SQuAD 1.1's task). A dev
question's context becomes its **whole article**: every paragraph joined with a blank line, the
answer offsets moved by the characters before its paragraph (3,600-13,100 MiniLM tokens per
article). ``--questions`` questions per dev article are asked (chosen by a hash of their ids,
spread over the article).

Per seed, from the imported checkpoint (default ``all-MiniLM-L6-v2``): one fine-tuning run on the
train articles' paragraphs (``--task qa`` on the written files; what a 2-core machine can train:
whole-article training windows of thousands of tokens per question are out of reach here), then
the same dev questions answered four ways:

- ``paragraph``: the question's own paragraph (the usual SQuAD setting; the upper reference);
- ``windows``: the whole article in the run's windows (``--max-length``, doc stride 128), the
  best span over all windows (BERT's §4.2 recipe, what users with long documents do);
- ``longformer``: the run made long (``ember convert --long``: positions copied, window
  ``--window``, the question under global attention) reading the article in one window;
- ``bigbird``: the same with BigBird's block-sparse attention (blocks of 64, 3 random).

The long models were never trained at these lengths or with these attention patterns (Longformer
§5 continued pre-training for 65k steps before fine-tuning long); the study shows what converting
a short model buys or costs as it is. EM/F1 (the official SQuAD script's), and CPU seconds per
question (one thread). OUT/table.md, table.json and long_squad.png. --smoke: a random small
model, a few questions, seconds (CI).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import SMOKE_NOTE, load, machine, pyplot, run_cli  # noqa: E402
from _checkpoint_study import prepare_init, start_study  # noqa: E402

import ember  # noqa: E402
from ember.errors import EmberError  # noqa: E402
from ember.fileio import atomic_write_text  # noqa: E402
from ember.paths import data_root  # noqa: E402

SEPARATOR = "\n\n"  # between an article's paragraphs
VARIANTS = ("paragraph", "windows", "longformer", "bigbird")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="HF checkpoint folder (default: DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--squad", help="SQuAD 2.0 JSON (default: DATA/squad2-dev-half/dev-v2.0.json)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--questions", type=int, default=30, help="dev questions asked per dev article")
    p.add_argument("--max-length", type=int, default=256, help="fine-tuning and window length (MiniLM's trained 256)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--long", type=int, default=16384, help="positions of the long models (the longest article fits)")
    p.add_argument("--window", type=int, default=512, help="Longformer's attention window")
    p.add_argument("--train-limit", type=int, default=0, help="training questions (0 = all)")
    p.add_argument("--paragraphs", type=int, default=0, help="cut each article to its first N paragraphs (0 = whole)")
    p.add_argument("--smoke", action="store_true", help="a random small model and a few questions (CI)")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.seeds or args.questions < 1:
        raise EmberError("--seeds names at least one seed and --questions is at least 1")
    args.checkpoint_name = "random (smoke)" if args.smoke else Path(args.checkpoint or "all-MiniLM-L6-v2").name
    return args


# -- the data ---------------------------------------------------------------------------------

def answerable(article: dict) -> dict:
    """The article with only its answerable questions (SQuAD 1.1's task); every paragraph stays,
    with or without questions (it is part of the article's text)."""
    paragraphs = [{"context": p["context"], "qas": [q for q in p["qas"] if not q.get("is_impossible") and q["answers"]]}
                  for p in article["paragraphs"]]
    return {"title": article["title"], "paragraphs": paragraphs}


def whole_article(article: dict) -> dict:
    """One paragraph holding every paragraph of ``article`` (its questions' or not); each answer's
    start moved by the characters before its paragraph (checked: the answer text is still there)."""
    context, qas = "", []
    for p in article["paragraphs"]:
        offset = len(context) + (len(SEPARATOR) if context else 0)
        context = context + SEPARATOR + p["context"] if context else p["context"]
        for q in p["qas"]:
            answers = [{"text": a["text"], "answer_start": a["answer_start"] + offset} for a in q["answers"]]
            for a in answers:
                if context[a["answer_start"]:a["answer_start"] + len(a["text"])] != a["text"]:
                    raise EmberError(f"question {q['id']}: answer {a['text']!r} not found at its moved offset")
            qas.append({**q, "answers": answers})
    return {"title": article["title"], "paragraphs": [{"context": context, "qas": qas}]}


def asked(article: dict, n: int) -> set[str]:
    """``n`` question ids of the article, spread over it (ordered by a hash of the id)."""
    ids = [q["id"] for p in article["paragraphs"] for q in p["qas"]]
    return set(sorted(ids, key=lambda i: hashlib.sha1(i.encode("utf-8")).hexdigest())[:n])


def keep_questions(article: dict, ids: set[str] | None = None) -> dict:
    """The paragraphs of ``article`` that hold questions (those in ``ids`` when given), with only those."""
    paragraphs = [{"context": p["context"], "qas": [q for q in p["qas"] if ids is None or q["id"] in ids]}
                  for p in article["paragraphs"]]
    return {"title": article["title"], "paragraphs": [p for p in paragraphs if p["qas"]]}


def write_data(args, out: Path) -> dict[str, Path]:
    """train.json (train articles' paragraphs), dev-paragraphs.json and dev-articles.json (the same
    asked questions, in their paragraph or their whole article)."""
    folder = out / "data"
    files = {name: folder / f"{name}.json" for name in ("train", "dev-paragraphs", "dev-articles")}
    if all(f.is_file() for f in files.values()):
        return files
    source = Path(args.squad) if args.squad else data_root() / "squad2-dev-half" / "dev-v2.0.json"
    articles = [answerable(a) for a in json.loads(source.read_text(encoding="utf-8"))["data"]]
    if args.paragraphs:
        articles = [{**a, "paragraphs": a["paragraphs"][:args.paragraphs]} for a in articles]
    from ember.tasks.qa.squad import read_squad, split_by_article

    dev = {ex.title for ex in split_by_article(read_squad(source), "dev")}  # the split `--task squad` makes
    train = [keep_questions(a) for a in articles if a["title"] not in dev]
    tests = [(a, asked(a, args.questions)) for a in articles if a["title"] in dev]
    paragraphs = [keep_questions(a, ids) for a, ids in tests]
    whole = [keep_questions(whole_article(a), ids) for a, ids in tests]  # the whole text, the asked questions
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (("train", train), ("dev-paragraphs", paragraphs), ("dev-articles", whole)):
        atomic_write_text(files[name], json.dumps({"version": "1.1", "data": data}))
    return files


# -- the runs ---------------------------------------------------------------------------------

def finetune(args, init: str, files: dict, run: Path, seed: int) -> None:
    if (run / "results.json").is_file():
        return
    resume = (run / "checkpoints").is_dir()
    smoke = {"model": "bert-mini", "tokenizer": args.smoke_tokenizer,
             "overrides": ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64"]} if args.smoke else {}
    ember.finetune(task="qa", train=str(files["train"]), dev=str(files["dev-paragraphs"]), init=init, out=run,
                   resume=resume, overwrite=not resume, seed=seed, epochs=args.epochs, lr=args.lr,
                   batch_size=args.batch_size, max_length=args.max_length, num_threads=1,
                   train_limit=args.train_limit or None, progress=False, **smoke)


def long_run(run: Path, attention: str, args) -> Path:
    """The fine-tuned run made long (positions copied; Longformer's global projections from the local ones)."""
    from ember.interop.long import lengthen_run

    out = run.parent / f"{run.name}-{attention}"
    if not (out / "model.safetensors").is_file():
        options = {"window": args.window} if attention == "longformer" else {}
        lengthen_run(run, out, args.long, attention=attention, **options)
    return out


def score(run: Path, file: Path, max_length: int | None, record: Path) -> dict:
    """EM/F1 of ``run`` on ``file`` and the CPU seconds it took, kept in ``record``."""
    if record.is_file():
        return json.loads(record.read_text())
    start = time.process_time()
    metrics = ember.evaluate(run, file=file, max_length=max_length)["metrics"]
    done = {"exact": metrics["exact"], "f1": metrics["f1"], "cpu": time.process_time() - start, "load": load()}
    atomic_write_text(record, json.dumps(done))
    return done


def run_seed(args, init: str, files: dict, out: Path, seed: int, questions: int) -> dict:
    run = out / "runs" / f"seed-{seed}"
    finetune(args, init, files, run, seed)
    records = out / "records" / f"seed-{seed}"
    records.mkdir(parents=True, exist_ok=True)
    scores = {"paragraph": score(run, files["dev-paragraphs"], None, records / "paragraph.json"),
              "windows": score(run, files["dev-articles"], None, records / "windows.json")}
    for attention in ("longformer", "bigbird"):
        scores[attention] = score(long_run(run, attention, args), files["dev-articles"], args.long,
                                  records / f"{attention}.json")
    for name, s in scores.items():
        s["cpu_per_question"] = s["cpu"] / questions
    print(f"seed {seed}: " + ", ".join(f"{v} EM {s['exact']:.2f} F1 {s['f1']:.2f}" for v, s in scores.items()), flush=True)
    return scores


def summarize(per_seed: dict) -> dict:
    table = {}
    for variant in VARIANTS:
        rows = [s[variant] for s in per_seed.values()]
        table[variant] = {k: {"mean": statistics.fmean(r[k] for r in rows),
                              "sd": statistics.stdev([r[k] for r in rows]) if len(rows) > 1 else None}
                          for k in ("exact", "f1", "cpu_per_question")}
    return table


def render(result: dict) -> str:
    m, t = result["meta"], result["table"]
    sd = lambda s, f="{:.2f}": "" if s["sd"] is None else " ± " + f.format(s["sd"])  # noqa: E731
    lines = [f"# SQuAD over whole articles: windows vs Longformer vs BigBird ({m['checkpoint']})", "",
             f"{m['machine']}; {m['load']}. Seeds {', '.join(map(str, m['seeds']))}; {m['questions']} dev questions "
             f"({m['articles']} dev articles, {m['tokens']} tokens per article); fine-tuned on the train articles' "
             f"paragraphs ({m['train_questions']} questions, {m['epochs']:g} epochs, lr {m['lr']:g}, batch "
             f"{m['batch_size']}, {m['max_length']}-token windows); long models: {m['long']} positions, Longformer "
             f"window {m['window']}, BigBird blocks of 64 with 3 random, converted from each seed's run, not trained long.", "",
             "| context | model | EM | F1 | CPU s per question |", "|---|---|---|---|---|"]
    names = {"paragraph": ("its paragraph", "the run"), "windows": ("whole article", f"the run, {m['max_length']}-token windows"),
             "longformer": ("whole article", "Longformer (converted)"), "bigbird": ("whole article", "BigBird (converted)")}
    for v in VARIANTS:
        s = t[v]
        lines.append(f"| {names[v][0]} | {names[v][1]} | {s['exact']['mean']:.2f}{sd(s['exact'])} | "
                     f"{s['f1']['mean']:.2f}{sd(s['f1'])} | {s['cpu_per_question']['mean']:.3f} |")
    if m["smoke"]:
        lines += SMOKE_NOTE
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.4))
    for ax, key, label in ((left, "f1", "dev F1"), (right, "cpu_per_question", "CPU s per question")):
        for k, v in enumerate(VARIANTS):
            values = [s[v][key] for s in result["per_seed"].values()]
            ax.bar(k, statistics.fmean(values), color=f"C{k}")
            ax.scatter([k] * len(values), values, s=10, color="black", zorder=3)
        ax.set_xticks(range(len(VARIANTS)), VARIANTS, fontsize=8)
        ax.set_ylabel(label)
    fig.suptitle(f"SQuAD over whole articles, {result['meta']['checkpoint']}, {len(result['per_seed'])} seed(s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.questions, args.train_limit, args.epochs, args.long, args.window = min(args.questions, 3), 16, 1.0, 2048, 64
        args.paragraphs = args.paragraphs or 4
        args.max_length, args.seeds = 128, args.seeds[:1]
    out = start_study(args)
    init = prepare_init(args, out)
    files = write_data(args, out)
    dev = json.loads(files["dev-articles"].read_text())["data"]
    questions = sum(len(a["paragraphs"][0]["qas"]) for a in dev)
    per_seed = {seed: run_seed(args, init, files, out, seed, questions) for seed in args.seeds}
    from ember.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(out / "runs" / f"seed-{args.seeds[0]}" / "tokenizer.json")
    tokenizer.no_truncation()
    lengths = [len(tokenizer.encode(a["paragraphs"][0]["context"]).ids) for a in dev]
    train = json.loads(files["train"].read_text())["data"]
    meta = {"checkpoint": args.checkpoint_name, "machine": machine(), "load": load(), "seeds": args.seeds,
            "questions": questions, "articles": len(dev), "tokens": f"{min(lengths):,}-{max(lengths):,}",
            "train_questions": args.train_limit or sum(len(p["qas"]) for a in train for p in a["paragraphs"]),
            "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "max_length": args.max_length,
            "long": args.long, "window": args.window, "smoke": args.smoke}
    result = {"meta": meta, "per_seed": per_seed, "table": summarize(per_seed)}
    atomic_write_text(out / "table.json", json.dumps(result, indent=2))
    text = render(result)
    atomic_write_text(out / "table.md", text)
    chart(result, out / "long_squad.png")
    print(text)
    return result


if __name__ == "__main__":
    run_cli(main)
