"""What each training order puts in a SQuAD batch (issue 46 item 4): paragraphs per batch, batches
that repeat a paragraph, the share of windows without the answer, and the padding, for random
batches ("shuffled"), the first length grouping ("length-grouped": pools sorted by length) and the
default ("length-grouped-spread": sorted, one window per paragraph per batch where the pool allows).

    PYTHONPATH=. python benchmarks/studies/qa_batch_order.py --max-length 256 --batch-size 32 --seeds 1,2,3

The windows are the real ones `ember finetune --task squad --max-length L` trains on (the 12
train articles of squad2-dev-half under the MiniLM tokenizer); nothing is trained, it takes
seconds. --smoke: 200 questions (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
from _bench import load, machine, run_cli  # noqa: E402

from ember.paths import data_path  # noqa: E402
from ember.train.length_groups import GROUPED, SHUFFLED, SPREAD, feature_groups, feature_lengths  # noqa: E402
from ember.train.loop import DataOrder  # noqa: E402


def squad_windows(max_length: int, limit: int | None):
    """(lengths, paragraph of each window, window lacks the answer) of the SQuAD 1.1 training windows."""
    from ember.tasks.qa.task import SquadAdapter
    from ember.tokenizers import load_tokenizer

    tok = load_tokenizer(data_path("checkpoints", "all-MiniLM-L6-v2", "tokenizer.json"))
    _, features = SquadAdapter("squad").load("train", tok, max_length, limit=limit)
    missing = np.array([f["start_position"] == f["cls_index"] for f in features])
    return np.array(feature_lengths(features)), np.array(feature_groups(features)), missing


def composition(order: np.ndarray, lengths, groups, missing, batch: int) -> dict[str, float]:
    """Mean over the epoch's whole batches."""
    idx = order[: len(order) // batch * batch].reshape(-1, batch)
    distinct = [len(set(groups[b])) for b in idx]
    return {"paragraphs_per_batch": float(np.mean(distinct)),
            "batches_repeating_a_paragraph": float(np.mean([d < batch for d in distinct])),
            "sd_no_answer_share": float(missing[idx].mean(1).std()),
            "padded_over_real_tokens": float((lengths[idx].max(1) * batch).sum() / lengths[idx].sum())}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--limit", type=int, default=None, help="questions (default: all 2,168)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--smoke", action="store_true", help="200 questions (CI)")
    args = parser.parse_args(argv)
    limit = 200 if args.smoke else args.limit
    lengths, groups, missing = squad_windows(args.max_length, limit)
    n, batch = len(lengths), args.batch_size
    print(f"# {machine()}; {load()}")
    print(f"# {n} windows of {len(set(groups))} paragraphs, max length {args.max_length}, batch {batch}; "
          f"{missing.mean():.1%} of windows lack the answer")
    orders = {SHUFFLED: lambda s: DataOrder(n, s), GROUPED: lambda s: DataOrder(n, s, lengths, batch, name=GROUPED),
              SPREAD: lambda s: DataOrder(n, s, lengths, batch, groups)}
    rows = []
    print("| order | paragraphs per batch | batches repeating a paragraph | sd of no-answer share | padded / real tokens |")
    print("|---|---:|---:|---:|---:|")
    for name, make in orders.items():
        each = [composition(make(int(s)).epoch_order(0), lengths, groups, missing, batch) for s in args.seeds.split(",")]
        row = {"order": name, **{k: float(np.mean([e[k] for e in each])) for k in each[0]}}
        rows.append(row)
        print(f"| {name} | {row['paragraphs_per_batch']:.1f} | {row['batches_repeating_a_paragraph']:.0%} | "
              f"{row['sd_no_answer_share']:.3f} | {row['padded_over_real_tokens']:.3f}x |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    run_cli(main)
