"""`ember quickstart`: raw text to a fine-tuned classifier in one command.

1. train a WordPiece tokenizer on English Wikipedia ($EMBER_DATA/wiki-en)
2. prepare token shards
3. pre-train bert-mini (MLM + NSP) for a few minutes
4. show fill-mask predictions
5. fine-tune on SST-2 and print dev accuracy
6. when the real checkpoint is there ($EMBER_DATA/checkpoints/all-MiniLM-L6-v2), fine-tune it on
   the same SST-2 sentences with the same settings and print both accuracies side by side: a few
   CPU minutes of pre-training against a model that has learned something

Without the data folder it says where data is expected and uses a corpus built from the
docstrings of Python's standard library (and a class-vs-function docstring task in place of
SST-2), so the whole path still runs.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ember.durations import format_duration
from ember.errors import EmberError
from ember.paths import data_root


def banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


CHECKPOINT = ("checkpoints", "all-MiniLM-L6-v2")  # under the data root


MARKER = ".ember-quickstart"  # what makes a folder one quickstart may replace


def replace_own_folder(out: Path) -> None:
    """Start ``out`` afresh when it is empty or an earlier quickstart's; refuse anything else
    (``--out runs`` or ``--out .`` would otherwise delete the user's runs or checkout)."""
    if out.exists() and not out.is_dir():
        raise EmberError(f"--out {out} is a file; name a folder for the quickstart")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise EmberError(f"--out {out} holds files that no quickstart wrote; the quickstart replaces its "
                             "folder on every run, so give it a new or empty one (default runs/quickstart)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `ember quickstart`, which replaces this folder on its next run\n")


def run_quickstart(out: Path, pretrain_steps: int = 300, pretrain_time: float = 360.0,
                   max_docs: int = 1500, finetune_epochs: float = 1.0, finetune_limit: int | None = 20000,
                   progress: bool = True, checkpoint: Path | None = None) -> dict:
    """``checkpoint``: a real pre-trained encoder to fine-tune on the same sentences at the end
    (default: the shipped one under the data root, when present; ``Path("")`` skips it)."""
    from ember.api import finetune, pretrain
    from ember.data.prepare import prepare_corpus
    from ember.tasks.inference.fill_mask import FillMask
    from ember.tokenizers import train_tokenizer

    started = time.time()
    replace_own_folder(out)
    wiki = data_root() / "wiki-en"
    sst2_root = data_root()
    if checkpoint is None:
        checkpoint = data_root().joinpath(*CHECKPOINT)
    real = wiki.is_dir() and (data_root() / "glue" / "SST-2").is_dir()
    task = "SST-2" if real else "the docstring task"  # what step 5 fine-tunes on
    with_checkpoint = real and str(checkpoint) not in ("", ".") and (checkpoint / "config.json").is_file()
    steps = 6 if with_checkpoint else 5
    if real:
        inputs, vocab = [str(wiki)], 30522
        print(f"using English Wikipedia from {wiki} (first {max_docs} articles) and SST-2")
    else:
        from ember.data.stdlib_corpus import build_stdlib_corpus

        print(f"no data folder at {data_root()} (expected wiki-en/ and glue/SST-2/ there; set "
              "EMBER_DATA to point elsewhere).\nFalling back to a corpus built from the docstrings of "
              "Python's standard library, and a class-vs-function docstring task instead of SST-2.")
        corpus, sst2_root = build_stdlib_corpus(out / "fallback")
        inputs, vocab = [str(corpus)], 8000

    banner(f"1/{steps} training a WordPiece tokenizer")
    tok = train_tokenizer(inputs, kind="wordpiece", vocab_size=vocab, max_documents=max_docs, progress=progress)
    tok.save(str(out / "tokenizer.json"))
    print(f"vocabulary: {tok.get_vocab_size()} tokens -> {out / 'tokenizer.json'}")

    banner(f"2/{steps} preparing token shards")
    prepare_corpus(inputs, out / "tokenizer.json", out / "prepared", max_docs=max_docs, progress=progress)

    banner(f"3/{steps} pre-training bert-mini (MLM + NSP), {pretrain_steps} steps or {format_duration(pretrain_time)}")
    trained = pretrain("bert-mini", out / "pretrain", data=out / "prepared", progress=progress, overrides=[
        f"model.vocab_size={tok.get_vocab_size()}", f"train.max_steps={pretrain_steps}",
        f"train.max_time={pretrain_time}", "train.lr=1e-3", "train.warmup_ratio=0.06",
        f"train.eval_every={max(pretrain_steps // 3, 1)}", f"train.save_every={max(pretrain_steps // 3, 1)}"])

    banner(f"4/{steps} fill-mask with the pre-trained model")
    fill = FillMask(out / "pretrain")
    for text in ("the capital of france is [MASK].", "he was born in the [MASK] of london."):
        shown = ", ".join(f"{t} ({p:.2g})" for t, p in fill(text, 5)[0])
        print(f"  {text}  ->  {shown}")

    banner(f"5/{steps} fine-tuning on {task} ({finetune_limit or 'all'} training sentences)")
    settings = dict(train_limit=finetune_limit, progress=progress, epochs=finetune_epochs, max_length=66, lr=1e-4,
                    batch_size=32, warmup_ratio=0.1, overrides=["train.log_every=50"])
    previous = os.environ.get("EMBER_DATA")
    os.environ["EMBER_DATA"] = str(sst2_root)
    try:
        result = finetune("sst2", out / "sst2", init=out / "pretrain", **settings)
    finally:
        if previous is None:
            os.environ.pop("EMBER_DATA", None)
        else:
            os.environ["EMBER_DATA"] = previous
    acc = result.metrics["accuracy"]
    print(f"\n{task} dev accuracy: {acc:.4f}  ({(time.time() - started) / 60:.1f} min in all)")
    print(f"run folders: {out / 'pretrain'} (curves.png, metrics.jsonl), {out / 'sst2'} (results.json)")
    if not with_checkpoint:
        if real and str(checkpoint) in ("", "."):
            print("(--checkpoint '': the comparison with a pre-trained model is skipped)")
        elif real:
            print(f"(no real checkpoint at {checkpoint}: the comparison with a pre-trained model is skipped)")
        return result.result
    banner(f"6/{steps} fine-tuning the real checkpoint {checkpoint.name} on the same "
           f"{finetune_limit or 'all'} SST-2 sentences")
    began = time.time()
    real_result = finetune("sst2", out / "sst2-checkpoint", init=checkpoint, **settings)
    minutes = (time.time() - began) / 60
    print(side_by_side(result.metrics["accuracy"], real_result.metrics["accuracy"], checkpoint.name,
                       finetune_limit, f"{trained.result.get('step', 0)} steps in "
                       f"{trained.result.get('elapsed', 0.0) / 60:.1f} min"))
    print(f"run folder: {out / 'sst2-checkpoint'} ({minutes:.1f} min). The checkpoint's sentence embeddings: "
          f"ember convert --from-hf {checkpoint} --out runs/minilm, then ember embed / ember evaluate --zero-shot")
    return {**result.result, "checkpoint": real_result.result}


def side_by_side(scratch: float, real: float, name: str, sentences: int | None, budget: str) -> str:
    """Both SST-2 dev accuracies, one line each, with what separates them."""
    rows = [(f"bert-mini, pre-trained here ({budget})", scratch),
            (f"{name} (a real pre-trained checkpoint)", real)]
    width = max(len(label) for label, _ in rows)
    lines = [f"\nSST-2 dev accuracy, fine-tuned on the same {sentences or 'all'} sentences with the same settings:"]
    lines += [f"  {label:<{width}}  {acc:.4f}" for label, acc in rows]
    lines.append(f"  difference: {100 * (real - scratch):+.1f} points")
    return "\n".join(lines)
