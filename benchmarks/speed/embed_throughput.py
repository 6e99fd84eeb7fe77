"""Sentence-embedding throughput: `ember embed` (PyTorch fp32 / int8, ONNX Runtime fp32 / int8)
vs sentence-transformers' ``encode`` on the same checkpoint, with STS-B quality and batch-1 latency.

    HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python benchmarks/speed/embed_throughput.py \
        --hf ../shared/data/checkpoints/all-MiniLM-L6-v2 --run runs/minilm --cpu-time \
        [--wiki-sentences 50000] [--repeats 3] [--backends torch int8 bf16 onnx onnx-int8]

(`--run` is the checkpoint imported with `ember convert --from-hf`.) Each contender embeds the
same texts with batch size 32 in its own default way: ember sorts the texts by token length
(``ember.embed``), sentence-transformers' ``encode`` sorts them by character length. Corpora:
the unique sentences of STS-B dev, and the first ``--wiki-sentences`` sentences of wiki-en
(5 to 80 words). The contenders run in turn in one process; the ratios are of medians.

Quality: STS-B dev Spearman (cosine, x100) of every contender; each must be within 0.5 (x100,
i.e. 0.005) of sentence-transformers' fp32. Latency: one sentence per call (STS-B sentences),
p50 and p99 in milliseconds of the benchmark's clock.

``--cpu-time`` times the CPU seconds of the whole process (ONNX Runtime's own threads
included) with torch and ONNX Runtime on one thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import _CLOCK, alternate, clock, clock_name, load, machine, median  # noqa: E402

from ember.api.embed import embed_with, load_embedder  # noqa: E402
from ember.serve import BACKENDS  # noqa: E402
from ember.tasks.inference.similarity import cosine, read_pairs, similarity_metrics, similarity_task  # noqa: E402

REFERENCE = "sentence-transformers"


def default_backends() -> list[str]:
    """All of them, bf16 only where the CPU multiplies bf16 in hardware (AMX): elsewhere it is
    ~100x slower than fp32 and would take the run's time for a known answer."""
    from ember.nn.onednn import cpu_has_fast_bf16

    return [b for b in BACKENDS if b != "bf16" or cpu_has_fast_bf16()]


def wiki_sentences(n: int, root: Path) -> list[str]:
    """The first ``n`` sentences of 5-80 words from wiki-en (document order, files sorted)."""
    from ember.data.readers import iter_documents
    from ember.data.sentences import split_sentences

    out: list[str] = []
    for doc in iter_documents(sorted((root / "wiki-en").glob("*/wiki_*.gz")), fmt="wiki"):
        for sentence in split_sentences(doc.text):
            if 5 <= len(sentence.split()) <= 80:
                out.append(sentence)
                if len(out) == n:
                    return out
    return out


def ember_embedder(run: str, backend: str, batch: int):
    predictor = load_embedder(run, backend, batch_size=batch, threads=1 if backend.startswith("onnx") else 0)
    return lambda texts: embed_with(predictor, texts)[0]


def reference_embedder(hf: str, batch: int):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local folder only, never a download
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(hf, device="cpu", local_files_only=True)
    return lambda texts: model.encode(texts, batch_size=batch, convert_to_numpy=True)


def sts_spearman(embed, pairs) -> float:
    unique = sorted({t for ex in pairs for t in (ex.text_a, ex.text_b)})
    vectors = embed(unique)
    row = {t: i for i, t in enumerate(unique)}
    cos = cosine(vectors[[row[ex.text_a] for ex in pairs]], vectors[[row[ex.text_b] for ex in pairs]])
    return similarity_metrics(cos, np.asarray([ex.label for ex in pairs], dtype=np.float64))["spearman_cosine"]


def latencies(embed, texts: list[str]) -> tuple[float, float]:
    """(p50, p99) milliseconds of embedding one text per call."""
    embed(texts[:2])  # warm-up
    times = []
    for text in texts:
        start = clock()
        embed([text])
        times.append(1000 * (clock() - start))
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", required=True, help="the sentence-transformers checkpoint folder")
    parser.add_argument("--run", required=True, help="the same checkpoint as an ember run (ember convert --from-hf)")
    parser.add_argument("--backends", nargs="+", default=default_backends(), choices=BACKENDS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--wiki-sentences", type=int, default=50000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-texts", type=int, default=200)
    parser.add_argument("--cpu-time", action="store_true", help="one thread each, CPU seconds of the process")
    parser.add_argument("--json")
    parser.add_argument("--smoke", action="store_true", help="a few texts, one repetition (CI)")
    args = parser.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
        _CLOCK.update(fn=time.process_time, name="cpu (process, 1 thread each)")
    if args.smoke:
        args.wiki_sentences, args.repeats, args.latency_texts = 64, 1, 4
    print(f"{machine()}; clock: {clock_name()}; {load()}", flush=True)
    data_root = Path(os.environ.get("EMBER_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    pairs = read_pairs(similarity_task("sts-b"), "dev")
    if args.smoke:
        pairs = pairs[:40]
    corpora = {"sts-b dev": sorted({t for ex in pairs for t in (ex.text_a, ex.text_b)}),
               "wiki-en": wiki_sentences(args.wiki_sentences, data_root)}
    embedders = {f"ember {b}": ember_embedder(args.run, b, args.batch) for b in args.backends}
    embedders[REFERENCE] = reference_embedder(args.hf, args.batch)
    result = {"clock": clock_name(), "load_before": load(), "batch": args.batch, "corpora": {},
              "spearman": {}, "latency_ms": {}}
    for name, embed in embedders.items():
        result["spearman"][name] = sts_spearman(embed, pairs)
    for corpus, texts in corpora.items():
        print(f"{corpus}: {len(texts)} texts, {sum(len(t.split()) for t in texts) / len(texts):.1f} words each; "
              f"{load()}", flush=True)
        contenders = {}
        for name, embed in embedders.items():
            contenders[name] = (lambda e=embed, t=texts: len(t) / _timed(e, t))
        rates = alternate(contenders, args.repeats)
        ref = median(rates[REFERENCE])
        result["corpora"][corpus] = {
            "texts": len(texts), "texts_per_s": {n: median(r) for n, r in rates.items()},
            "ratio": {n: median(r) / ref for n, r in rates.items() if n != REFERENCE},
            "ratio_each": {n: [a / b for a, b in zip(r, rates[REFERENCE])] for n, r in rates.items() if n != REFERENCE},
            "load_after": load()}
    one = corpora["sts-b dev"][: args.latency_texts]
    for name, embed in embedders.items():
        result["latency_ms"][name] = latencies(embed, one)
    result["load_after"] = load()
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def _timed(embed, texts) -> float:
    start = clock()
    embed(texts)
    return clock() - start


def print_result(r: dict) -> None:
    ref_rho = r["spearman"][REFERENCE]
    print(f"\nclock: {r['clock']}, batch {r['batch']}, {r['load_before']} -> {r['load_after']}")
    head = "".join(f"{c + ' texts/s':>18s}{'vs ST':>7s}" for c in r["corpora"])
    print(f"{'':24s}{head}{'STS-B rho':>10s}{'d rho':>7s}{'p50 ms':>8s}{'p99 ms':>8s}")
    for name, rho in r["spearman"].items():
        cells = ""
        for c in r["corpora"].values():
            ratio = c["ratio"].get(name)
            cells += f"{c['texts_per_s'][name]:18,.0f}{(f'{ratio:.2f}x' if ratio else ''):>7s}"
        p50, p99 = r["latency_ms"][name]
        print(f"{name:24s}{cells}{rho:10.2f}{rho - ref_rho:+7.2f}{p50:8.1f}{p99:8.1f}")


if __name__ == "__main__":
    main()
