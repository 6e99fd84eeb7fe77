"""Word senses from a real checkpoint: does an encoder's vector for "bank" tell the river bank
from the money bank, layer by layer, where a static word embedding cannot?

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/studies/word_senses.py --word bank --out runs/senses-bank

The probe of Peters et al. 2018 (ELMo, §5.3: word sense disambiguation by 1-nearest neighbour
over contextual vectors, biLM layer 1 vs 2) and of Wiedemann et al. 2019 ("Does BERT make any
sense?", kNN sense classification from BERT's layers), on real Wikipedia text with the shipped
all-MiniLM-L6-v2 (any encoder run or HF folder with --model):

1. Sentences: every English Wikipedia sentence (EMBER_DATA/wiki-en) with the word once, labelled
   with a sense by a context-word rule (``_sense_data``; the rule is written into results.md).
   For each seed, a balanced sample of ``--per-sense`` occurrences per sense.
2. Vectors: ``ember.load(MODEL).embed(sentences, pooling="none", layer=k)`` per layer k (0 = the
   embedding layer's output: word + position + segment embeddings, LayerNorm; 1..L the
   transformer layers); the word's vector is the mean of its word pieces' vectors.
3. Baselines: the word's static input embedding (the word-piece embedding row: the same vector
   for every occurrence, so 1-NN is at chance by construction) and a bag-of-words context vector
   (the mean of the static input embeddings of the sentence's other word pieces). The rule labels
   by context words, so the bag holds the very cue that set the label; a second bag without the
   rule's cue words shows how much of its score is that.
4. Per layer and seed: leave-one-out 1-NN sense accuracy (cosine; a tie among nearest neighbours
   counts as the expected accuracy of picking one of them at random, so identical vectors score
   the leave-one-out chance (m - 1) / (2m - 1) with m per sense, just under 50%), k-means (k = 2) purity,
   and the silhouette of the gold senses (cosine). Mean ± sample std over seeds.

Writes OUT/results.md (the rule, the counts, the table, a reading), OUT/results.json and
OUT/senses.png. ``--smoke`` builds a tiny random BERT in-process (no checkpoint needed) and
reads twelve Wikipedia files: a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers

import _sense_data as data
from _bench import load, machine, run_cli

from ember.errors import EmberError

CHECKPOINT = ("checkpoints", "all-MiniLM-L6-v2")


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--word", default="bank", choices=sorted(data.SENSES), help="the polysemous word (default bank)")
    p.add_argument("--model", help="an encoder run, export or HF folder (default: EMBER_DATA/checkpoints/all-MiniLM-L6-v2)")
    p.add_argument("--wiki", help="WikiExtractor folder (default: EMBER_DATA/wiki-en)")
    p.add_argument("--max-files", type=int, default=None, help="read only the first N wiki files (default: all)")
    p.add_argument("--per-sense", type=int, default=150, help="occurrences per sense in each sample (default 150)")
    p.add_argument("--seeds", default="1,2,3", help="sampling seeds (default 1,2,3)")
    p.add_argument("--out", required=True, help="folder for results.md, results.json and senses.png")
    p.add_argument("--smoke", action="store_true", help="tiny random BERT, twelve wiki files: checks the script")
    return p.parse_args(argv)


# -- vectors -------------------------------------------------------------------------------------
def word_pieces(tokenizer, occ: data.Occurrence, cues: set[str]) -> tuple[list[int], list[int], set[int]]:
    """(positions of the word's pieces, token ids, positions of pieces of the rule's cue words) in the
    model's encoding of the sentence."""
    enc = tokenizer.encode(occ.text)
    inside = [i for i, (a, b) in enumerate(enc.offsets) if b > a >= occ.start and b <= occ.end]
    if not inside:
        raise EmberError(f"the tokenizer gives no piece for {occ.text[occ.start:occ.end]!r} in {occ.text!r}")
    cue_spans = [m.span() for m in re.finditer(r"[A-Za-z]+", occ.text) if m.group().lower() in cues]
    in_cue = {i for i, (a, b) in enumerate(enc.offsets) if b > a and any(s <= a < e for s, e in cue_spans)}
    return inside, list(enc.ids), in_cue


def mean_rows(table: np.ndarray, ids: list[int]) -> np.ndarray:
    return table[ids].mean(0) if ids else np.zeros(table.shape[1], dtype=table.dtype)


def static_table(model) -> np.ndarray:
    """The run's input word-piece embedding matrix (vocabulary x H), as stored in its weights."""
    from safetensors import safe_open

    with safe_open(str(model.path / "model.safetensors"), "np") as f:
        names = f.keys()
        keys = [k for k in names if k.endswith("embeddings.word.weight")]
        if len(keys) != 1:
            raise EmberError(f"{model.path}: expected one word-embedding matrix, found {keys or 'none'}")
        return f.get_tensor(keys[0]).astype(np.float32)


def vectors(model, occurrences: list[data.Occurrence], cues: set[str]) -> dict[str, np.ndarray]:
    """name -> (N, H): "static", the two bag-of-words baselines, and "layer k" for the embedding
    layer (0) and every transformer layer."""
    tokenizer, table = model.tokenizer, static_table(model)
    special = {tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "<s>", "</s>", "<pad>")} - {None}
    pieces = [word_pieces(tokenizer, occ, cues) for occ in occurrences]
    if table.shape[1] != model.info["hidden_size"]:
        raise EmberError(f"{model.path}: factorised embeddings ({table.shape[1]} wide); the static baseline "
                         "needs the word-piece vectors in the hidden size")

    def context(at, ids, skip):
        return [t for i, t in enumerate(ids) if i not in at and i not in skip and t not in special]

    out = {"static": np.stack([mean_rows(table, [ids[i] for i in at]) for at, ids, _ in pieces]),
           "bag of words": np.stack([mean_rows(table, context(at, ids, ())) for at, ids, _ in pieces]),
           # without the words the labelling rule looked at: how much of the bag is the label itself
           "bag of words, cues removed": np.stack([mean_rows(table, context(at, ids, cue)) for at, ids, cue in pieces])}
    texts = [occ.text for occ in occurrences]
    for k in range(model.info["num_layers"] + 1):
        states = model.embed(texts, pooling="none", layer=k, normalize=False)
        for s, (_, ids, _) in zip(states, pieces):
            if len(s) != len(ids):
                raise EmberError(f"the model embedded {len(s)} tokens where its tokenizer gives {len(ids)}")
        out[f"layer {k}"] = np.stack([s[at].mean(0) for s, (at, _, _) in zip(states, pieces)])
    return out


# -- measures ------------------------------------------------------------------------------------
def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def nn_accuracy(x: np.ndarray, y: np.ndarray) -> float:
    """Leave-one-out 1-nearest-neighbour accuracy by cosine; a query whose nearest neighbours tie
    scores the share of them with its sense (the expected accuracy of a random pick among them),
    so identical vectors score chance, not an artefact of the sort order."""
    u = unit(x.astype(np.float64))
    sim = u @ u.T
    np.fill_diagonal(sim, -np.inf)
    best = sim.max(1, keepdims=True)
    tied = sim >= best - 1e-9
    same = y[:, None] == y[None, :]
    return float(np.mean((tied & same).sum(1) / tied.sum(1)))


def kmeans_purity(x: np.ndarray, y: np.ndarray, seed: int) -> float:
    """k-means (k = 2, on unit vectors) cluster purity against the gold senses: 0.5 = no separation
    on a balanced sample, 1 = the clusters are the senses."""
    from sklearn.cluster import KMeans

    with warnings.catch_warnings():  # identical vectors: one distinct cluster, purity 0.5
        warnings.simplefilter("ignore")
        found = KMeans(n_clusters=2, n_init=10, random_state=seed).fit_predict(unit(x))
    return float(sum(np.bincount(y[found == c]).max() for c in np.unique(found)) / len(y))


def silhouette(x: np.ndarray, y: np.ndarray) -> float:
    """Mean silhouette of the gold senses, cosine distance (-1..1; 0 = no separation)."""
    from sklearn.metrics import silhouette_score

    if np.ptp(x, axis=0).max() < 1e-12:  # all vectors equal: no separation at all
        return 0.0
    return float(silhouette_score(x, y, metric="cosine"))


def measure(vecs: dict[str, np.ndarray], y: np.ndarray, seed: int) -> dict[str, dict]:
    return {name: {"nn_accuracy": nn_accuracy(x, y), "kmeans_purity": kmeans_purity(x, y, seed),
                   "silhouette": silhouette(x, y)} for name, x in vecs.items()}


def summarise(per_seed: list[dict]) -> dict:
    out = {}
    for name in per_seed[0]:
        out[name] = {}
        for metric in per_seed[0][name]:
            values = [run[name][metric] for run in per_seed]
            out[name][metric] = {"mean": statistics.fmean(values),
                                 "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}
    return out


# -- models --------------------------------------------------------------------------------------
def smoke_model(folder: Path, occurrences: list[data.Occurrence]):
    """A tiny random BERT (2 layers x 32) with a WordPiece vocabulary trained on the sentences."""
    import torch
    import transformers

    import ember
    from ember.interop.convert import import_hf
    from ember.tokenizers import train_tokenizer

    transformers.utils.logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "sentences.txt"
    text.write_text("\n".join(o.text for o in occurrences), encoding="utf-8")
    tok = train_tokenizer([text], vocab_size=600, progress=False)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=128)
    hf = folder / "hf"
    transformers.BertModel(config).save_pretrained(hf)
    tok.save(str(hf / "tokenizer.json"))
    run = folder / "run"
    shutil.rmtree(run, ignore_errors=True)  # a run left by another --word has another vocabulary
    import_hf(hf, run)
    return ember.load(run)


def main(argv: list[str] | None = None) -> dict:
    import _sense_report as report

    import ember
    from ember.fileio import atomic_write_text
    from ember.paths import data_root

    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.smoke:
        args.max_files = args.max_files or 12
        args.per_sense = min(args.per_sense, 12)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    files = data.wiki_files(Path(args.wiki) if args.wiki else data_root() / "wiki-en", args.max_files)
    found, counts = data.collect(args.word, files)
    if args.smoke:
        model, model_name = smoke_model(out / "smoke-model", found), "tiny random BERT (smoke)"
    else:
        folder = Path(args.model) if args.model else data_root().joinpath(*CHECKPOINT)
        model, model_name = ember.load(folder), str(folder)
    # a sentence the model would truncate is dropped (its vectors would not be the whole sentence's)
    fits = [occ for occ in found if len(model.tokenizer.encode(occ.text).ids) <= model.info["max_length"]]
    counts["longer than the model's max length"] = len(found) - len(fits)
    counts["labelled"] = len(fits)
    groups = data.by_sense(fits, args.word)
    print(f"{args.word}: {len(fits)} labelled sentences in {len(files)} files "
          f"({', '.join(f'{k} {len(v)}' for k, v in groups.items())})", flush=True)
    samples = {seed: data.balanced_sample(groups, args.per_sense, seed) for seed in seeds}
    # every sampled sentence embedded once, whichever seeds drew it
    union = sorted({occ for sample in samples.values() for occ in sample}, key=lambda o: (o.text, o.start))
    row = {occ: i for i, occ in enumerate(union)}
    t1 = time.time()
    cues = {cue for words in data.rule(args.word)["senses"].values() for cue in words}
    all_vecs = vectors(model, union, cues)
    embed_s = time.time() - t1
    senses = sorted(groups)
    per_seed = []
    for seed, sample in samples.items():
        idx = np.asarray([row[o] for o in sample])
        y = np.asarray([senses.index(o.sense) for o in sample])
        per_seed.append(measure({name: x[idx] for name, x in all_vecs.items()}, y, seed))
    summary = summarise(per_seed)
    layers = [name for name in summary if name.startswith("layer ")]
    best = max(layers, key=lambda n: summary[n]["nn_accuracy"]["mean"])
    result = {
        "word": args.word, "model": model_name, "smoke": args.smoke, "files": len(files), "seeds": seeds,
        "rule": data.rule(args.word), "counts": counts, "labelled": {k: len(v) for k, v in groups.items()},
        "per_sense": len(next(iter(samples.values()))) // len(senses), "sentences_embedded": len(union),
        "num_layers": model.info["num_layers"], "summary": summary, "per_seed": per_seed, "best_layer": best,
        "examples": {k: [o.text for o in v[:3]] for k, v in groups.items()},
        "machine": machine(), "load": load(), "embed_seconds": round(embed_s, 1),
        "total_seconds": round(time.time() - t0, 1),
        "command": "python benchmarks/studies/word_senses.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    report.write(out, result)
    atomic_write_text(out / "results.json", report.to_json(result))
    print(report.table(result))
    print(f"wrote {out / 'results.md'}, results.json, senses.png ({result['total_seconds']} s, {result['load']})")
    return result


if __name__ == "__main__":
    run_cli(main)
