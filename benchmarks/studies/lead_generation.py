"""Wikipedia lead generation: ROUGE-1/2/Lsum of BART, T5 and the lead baseline at one CPU budget
(issue 41, item 4). No summarisation corpus is in the data folder, so the task is built from real
text, WikiSum's idea (Liu et al. 2018) at sentence scale: for each article, the target is its first
sentence and the input the rest of its first section (the following sentences, whole, up to
--input-words words), held out by article (a hash of the title decides train or dev).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/lead_generation.py --out runs/lead
    ... --smoke      # tiny everything on one file of real articles, under a minute

  lead   the input's first sentence, copied (the baseline every summariser is compared with)
  bart   bart-mini narrowed to bart-tiny's shape (2 + 2 layers x 128), pre-trained with BART's
         noising (infilling + sentence permutation) on other articles, fine-tuned text to text
  t5     t5-tiny (the same shape), pre-trained with span corruption on the same articles, fine-tuned
         text to text with the same epochs, batch and input length (so the same steps)
Both decode dev with beam search and BART's summarisation settings scaled to one sentence (length
penalty, no repeated 3-grams, a minimum length): ember's seq2seq loop, ember's ROUGE
(ember.tasks.metrics.text), checked against rouge-score on the same pairs, beside the number of
distinct outputs (a model that writes one string for every input still scores some ROUGE).
Pre-training reads the AA files, the task the AB files, so no dev article was seen in pre-training
either. A finished side is kept in OUT/<system>-side.json: a rerun rescores it, training nothing.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import torch

import ember
from ember.data.readers import DocumentReader
from ember.data.sentences import split_sentences
from ember.errors import EmberError
from ember.paths import data_root

# The two budgets. The real one is sized for a 2-core machine shared with other jobs: a few
# CPU-minutes per model, one thread. "same budget" = the same shape, pre-training steps, batch,
# block length, fine-tuning epochs, batch and input length for both models.
REAL = {"task_files": 30, "pretrain_files": 10, "vocab": 4000, "tokenizer_docs": 800, "pretrain_docs": 1500,
        "pretrain_steps": 400, "pretrain_batch": 16, "block": 128, "train_pairs": 1200, "epochs": 3,
        "batch": 16, "dev_pairs": 150, "beams": 4, "shape": ["model.num_layers=2", "model.hidden_size=128",
                                                             "model.num_heads=2", "model.intermediate_size=512"]}
SMOKE = {"task_files": 3, "pretrain_files": 1, "vocab": 600, "tokenizer_docs": 20, "pretrain_docs": 30,
         "pretrain_steps": 3, "pretrain_batch": 4, "block": 64, "train_pairs": 24, "epochs": 1, "batch": 8,
         "dev_pairs": 6, "beams": 2, "shape": ["model.num_layers=1", "model.hidden_size=32", "model.num_heads=2",
                                                "model.intermediate_size=64"]}
INPUT_WORDS, TARGET_WORDS = 100, 60  # inputs of whole sentences up to 100 words; longer first sentences dropped
MAX_LENGTH = 192  # input tokens at fine-tuning and decoding (100 words are ~140 tokens of a 4k BPE)
DEV_PERCENT = 10
# BART's CNN/DM decoding (fairseq: beam 4, lenpen 2.0, no_repeat_ngram_size 3, min_len 55 of
# ~56-word summaries) scaled to one-sentence targets (~25 words): the minimum is 5 tokens
DECODING = {"length_penalty": 2.0, "no_repeat_ngram_size": 3, "min_new_tokens": 5, "max_new_tokens": 64}
ROUGE_KEYS = ("rouge1", "rouge2", "rougeLsum")
_TITLE = re.compile(r'<doc [^>]*title="([^"]*)"')


# ---- the task -------------------------------------------------------------------------------

def doc_titles(path: Path) -> dict[int, str]:
    """Line of each <doc> -> its title. ember's wiki reader drops the title (a document is its
    text), so it is read from the <doc> lines here, keyed as the reader's Document.line is."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return {n: m.group(1) for n, line in enumerate(f, 1) if (m := _TITLE.match(line.strip()))}


def is_heading(line: str) -> bool:
    """WikiExtractor writes section titles as short lines ending in "." ("History.", "Probabilistic
    nature of half-life."); a first-section sentence that short is rare, and mistaking one only
    ends the first section early."""
    return len(line.split()) <= 6 and line.endswith(".") and len(split_sentences(line)) == 1


def lead_pair(text: str) -> tuple[str, str] | None:
    """(input, target) of one article's text, or None when its first section cannot make one."""
    section = []
    for line in text.split("\n"):
        if is_heading(line):
            break
        section.append(line)
    sentences = split_sentences("\n".join(section))
    if len(sentences) < 2 or not 4 <= len(sentences[0].split()) <= TARGET_WORDS:
        return None
    target, kept, words = sentences[0], [], 0
    for sentence in sentences[1:]:
        words += len(sentence.split())
        if words > INPUT_WORDS:
            break
        kept.append(sentence)
    source = " ".join(kept)
    # the target inside the input (a lead repeated in the body) would make the task a copy
    if len(source.split()) < 10 or target in source:
        return None
    return source, target


def split_of(title: str) -> str:
    """dev for DEV_PERCENT% of titles by their SHA-1: the same article is always on the same side."""
    return "dev" if int(hashlib.sha1(title.encode("utf-8")).hexdigest()[:8], 16) % 100 < DEV_PERCENT else "train"


def build_task(files: list[Path], out: Path) -> dict:
    """train.jsonl / dev.jsonl (title, input, target per line; ember's text2text reader takes
    input/target) under ``out``; the counts."""
    reader = DocumentReader([str(f) for f in files], fmt="wiki")
    titles = {str(f): doc_titles(f) for f in files}
    rows, skipped = {"train": [], "dev": []}, 0
    for doc in reader:
        title = titles[doc.source][doc.line]
        pair = lead_pair(doc.text)
        if pair is None:
            skipped += 1
            continue
        rows[split_of(title)].append({"id": title, "input": pair[0], "target": pair[1]})
    for split, items in rows.items():
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items))
    return {"articles": reader.documents, "skipped": skipped, "files": [f.name for f in files],
            **{f"{split}_pairs": len(items) for split, items in rows.items()}}


def scored_task(files: list[Path], task: Path, dev_pairs: int) -> tuple[dict, list[dict]]:
    """The task under ``task`` (build_task's counts) and the first ``dev_pairs`` dev pairs, the ones
    every system is scored on, written to dev-scored.jsonl (fine-tuning also selects its epoch on
    them, as the task's own dev; the lead baseline has nothing to select)."""
    task.mkdir(parents=True, exist_ok=True)
    counts = build_task(files, task)
    dev = read_jsonl(task / "dev.jsonl")[:dev_pairs]
    (task / "dev-scored.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in dev))
    return counts, dev


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---- scoring --------------------------------------------------------------------------------

def scores(outputs: list[str], targets: list[str]) -> dict:
    """ember's ROUGE (0-100) and the largest gap to rouge-score's on the same pairs."""
    from rouge_score import rouge_scorer

    from ember.tasks.metrics.text import generation_metrics

    ours = generation_metrics(outputs, targets)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=False)
    theirs = {k: 0.0 for k in ROUGE_KEYS}
    for output, target in zip(outputs, targets):
        for k, s in scorer.score(target, output).items():
            theirs[k] += 100.0 * s.fmeasure / len(targets)
    # ROUGE alone cannot tell a summariser from a constant string of frequent words ("The the a
    # of ..." scores ROUGE-1 ~15 against Wikipedia leads): how many outputs differ, and their length
    return {**{k: ours[k] for k in ROUGE_KEYS}, "rouge_score": theirs,
            "max_gap": max(abs(ours[k] - theirs[k]) for k in ROUGE_KEYS),
            "distinct_outputs": len(set(outputs)), "mean_words": sum(len(o.split()) for o in outputs) / len(outputs)}


def lead_outputs(inputs: list[str]) -> list[str]:
    return [split_sentences(text)[0] for text in inputs]


# ---- the models -----------------------------------------------------------------------------

def corpus(kind: str, files: list[Path], out: Path, b: dict) -> Path:
    """A tokenizer in the family's layout (BART: byte-level BPE with <mask>; T5: Unigram with 100
    sentinels), both cased, and the prepared pre-training shards."""
    from ember.data.prepare import prepare_corpus
    from ember.tokenizers import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    if not (out / "prepared").is_dir():
        tok = train_tokenizer([str(f) for f in files], kind=kind, vocab_size=b["vocab"], lowercase=False,
                              max_documents=b["tokenizer_docs"], progress=False)
        tok.save(str(out / "tokenizer.json"))
        prepare_corpus([str(f) for f in files], out / "tokenizer.json", out / "prepared", max_docs=b["pretrain_docs"],
                       valid_fraction=0.02, progress=False)
    return out / "prepared"


def decode(run: Path, inputs: list[str], beams: int) -> list[str]:
    """Dev outputs of a fine-tuned run by ember's seq2seq loop with the summarisation settings
    (the task's own evaluation decodes with beams and length penalty only)."""
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_ids
    from ember.tokenizers import sequence_end_id
    from ember.tokenizers.sentinels import decode_with_sentinels

    model, tok = load_seq2seq_lm(run)
    encoded = []
    for text in inputs:  # as fine-tuning read them: at most MAX_LENGTH tokens, the closing </s> kept
        ids = tok.encode(text).ids
        encoded.append(ids if len(ids) <= MAX_LENGTH else ids[:MAX_LENGTH - 1] + ids[-1:])
    cfg = Seq2SeqGenerationConfig(num_beams=beams, **DECODING)
    with torch.inference_mode():
        new = seq2seq_generate_ids(model, encoded, cfg, sequence_end_id(tok))
    return [decode_with_sentinels(tok, ids).strip() for ids in new]


def model_side(name: str, recipe: str, kind: str, pretrain_files: list[Path], task: Path, out: Path, b: dict) -> dict:
    prepared = corpus(kind, pretrain_files, out / f"{name}-corpus", b)
    from ember.tokenizers import load_tokenizer

    vocab = load_tokenizer(prepared.parent / "tokenizer.json").get_vocab_size()
    common = b["shape"] + [f"model.vocab_size={vocab}", "train.num_threads=1", "train.log_every=10",
                           f"data.max_seq_length={b['block']}", f"train.batch_size={b['pretrain_batch']}",
                           "train.grad_accum=1", f"train.max_steps={b['pretrain_steps']}", "train.eval_every=0",
                           f"train.save_every={b['pretrain_steps']}", "model.max_position=256"]
    if recipe == "t5-tiny":
        common.remove("model.max_position=256")  # relative positions: no table to size
    clock = time.process_time()
    ember.pretrain(recipe, out / f"{name}-pretrained", data=prepared, overrides=common, overwrite=True, progress=False)
    pretrain_cpu = time.process_time() - clock
    side = finetune_side(str(out / f"{name}-pretrained"), task, out / f"{name}-finetuned", b)
    return {**side, "cpu_s": {"pretrain": pretrain_cpu, **side["cpu_s"]}, "pretrain_steps": b["pretrain_steps"]}


def finetune_side(init, task: Path, run: Path, b: dict) -> dict:
    """Fine-tune ``init`` (a pre-training run, or an ``ember.runs.init.Init``) text to text on the
    task into ``run`` and decode the scored dev pairs: the outputs, greedy dev ROUGE, CPU seconds
    and steps (also used by benchmarks/studies/bart_noising.py)."""
    clock = time.process_time()
    tuned = ember.finetune("text2text", run, init=init, train=str(task / "train.jsonl"),
                           dev=str(task / "dev-scored.jsonl"), epochs=b["epochs"], batch_size=b["batch"],
                           max_length=MAX_LENGTH, train_limit=b["train_pairs"], overwrite=True, progress=False,
                           overrides=["train.num_threads=1"])
    finetune_cpu = time.process_time() - clock
    dev = read_jsonl(task / "dev-scored.jsonl")
    clock = time.process_time()
    outputs = decode(run, [r["input"] for r in dev], b["beams"])
    decode_cpu = time.process_time() - clock
    train_log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = max((r.get("step", 0) for r in train_log), default=0)
    return {"outputs": outputs, "greedy_dev": {k: tuned.metrics.get(k) for k in ROUGE_KEYS},
            "cpu_s": {"finetune": finetune_cpu, "decode": decode_cpu}, "finetune_steps": steps}


# ---- the study ------------------------------------------------------------------------------

def table_markdown(rows: list[dict], budget: str) -> str:
    lines = [f"Wikipedia lead generation, dev; {budget}", "",
             "| system | ROUGE-1 | ROUGE-2 | ROUGE-Lsum | rouge-score R-1/R-2/R-Lsum | distinct outputs | words | "
             "pre-train steps | fine-tune steps | CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rs = r["rouge_score"]
        lines.append(f"| {r['system']} | {r['rouge1']:.2f} | {r['rouge2']:.2f} | {r['rougeLsum']:.2f} | "
                     f"{rs['rouge1']:.2f}/{rs['rouge2']:.2f}/{rs['rougeLsum']:.2f} | {r['distinct_outputs']} | "
                     f"{r['mean_words']:.1f} | {r.get('pretrain_steps', '-')} | "
                     f"{r.get('finetune_steps', '-')} | {sum(r.get('cpu_s', {}).values()):.0f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (task files, runs, table.md, table.json)")
    parser.add_argument("--smoke", action="store_true", help="tiny everything on one file: a check, not a measurement")
    parser.add_argument("--systems", default="lead,bart,t5", help="comma list of lead, bart, t5")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - {"lead", "bart", "t5"}
    if unknown:
        raise EmberError(f"unknown system(s) {', '.join(sorted(unknown))}: choose from lead, bart, t5")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    b = SMOKE if args.smoke else REAL
    torch.set_num_threads(1)
    wiki = data_root() / "wiki-en"
    task_files = sorted((wiki / "AB").glob("wiki_*.gz"))[: b["task_files"]]
    pretrain_files = sorted((wiki / "AA").glob("wiki_*.gz"))[: b["pretrain_files"]]
    out = Path(args.out)
    task = out / "task"
    counts, dev = scored_task(task_files, task, b["dev_pairs"])
    print(f"lead generation: {counts['articles']} articles of {len(task_files)} file(s) -> "
          f"{counts['train_pairs']} train / {counts['dev_pairs']} dev pairs (one per article; "
          f"{counts['skipped']} articles without a usable first section); scoring {len(dev)} dev pairs", flush=True)
    targets = [r["target"] for r in dev]
    rows, outputs = [], {}
    for system in args.systems:
        if system == "lead":
            outputs[system] = lead_outputs([r["input"] for r in dev])
            row = {"system": "lead"}
        else:
            recipe, kind = ("bart-mini", "bpe") if system == "bart" else ("t5-tiny", "unigram")
            cache = out / f"{system}-side.json"  # a finished side is kept: a rerun only rescores it
            saved = json.loads(cache.read_text()) if cache.is_file() else {}
            if saved.get("budget") != b or saved.get("targets") != targets:
                saved = {"budget": b, "targets": targets,
                         "side": model_side(system, recipe, kind, pretrain_files, task, out, b)}
                cache.write_text(json.dumps(saved, ensure_ascii=False))
            side = dict(saved["side"])
            outputs[system] = side.pop("outputs")
            row = {"system": system, **side}
        row.update(scores(outputs[system], targets))
        rows.append(row)
        print(f"{system}: R-1 {row['rouge1']:.2f}  R-2 {row['rouge2']:.2f}  R-Lsum {row['rougeLsum']:.2f}", flush=True)
    budget = (f"{'smoke' if args.smoke else 'real'} budget: pre-training {b['pretrain_steps']} steps x "
              f"{b['pretrain_batch']} blocks of {b['block']} tokens, fine-tuning {b['epochs']} epoch(s) of "
              f"{min(b['train_pairs'], counts['train_pairs'])} pairs at batch {b['batch']}, beam {b['beams']}, "
              "one thread")
    markdown = table_markdown(rows, budget)
    print(markdown)
    (out / "table.md").write_text(markdown)
    examples = [{"title": r["id"], "target": r["target"], **{s: outputs[s][i] for s in outputs}}
                for i, r in enumerate(dev[:10])]
    result = {"task": counts, "scored_dev_pairs": len(dev), "budget": budget, "decoding": DECODING, "rows": rows,
              "examples": examples, "outputs": outputs}
    (out / "table.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return result


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EmberError as exc:
        raise SystemExit(f"error: {exc}")
