"""`ember elmo-features`: frozen ELMo features (or static embeddings only) for a task model."""

from __future__ import annotations

import argparse

from ember.commands.common import count_arg
from ember.durations import duration_arg


def register(sub) -> None:
    p = sub.add_parser(
        "elmo-features",
        help="train a task model on frozen ELMo features [x_k; ELMo_k] (or static x_k only)",
        description="Feature-based transfer as in ELMo (Peters et al. 2018, §3.3): the biLM of an "
        "ELMo run stays frozen, a per-task ScalarMix weighs its layers into ELMo_k, and a BiLSTM "
        "classifier with concat pooling [h_T, max, mean] reads [x_k; ELMo_k] (x_k: word "
        "embeddings learned on the task). --no-elmo trains the same model on x_k alone, the "
        "baseline. Evaluates on dev each epoch, keeps the best weights; OUT/results.json holds "
        "the best dev accuracy (CoNLL-2003: entity F1) and the learned layer weights. Example:\n"
        "  ember pretrain --recipe elmo-mini --data ../shared/data/wiki-en --out runs/elmo --max-time 15m\n"
        "  ember elmo-features --elmo runs/elmo --task sst2 --out runs/sst2-elmo --train-limit 8000\n"
        "  ember elmo-features --elmo runs/elmo --task sst2 --out runs/sst2-static --train-limit 8000 --no-elmo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--elmo", help="ELMo run folder (from `ember pretrain --recipe elmo-mini`); with "
                   "--no-elmo optional, it then only sets the tokenization (lower-casing)")
    p.add_argument("--task", required=True, help="sst2 or cola (sentence classification) or conll2003 "
                   "(NER tagging, entity-level F1)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--no-elmo", action="store_true", help="baseline: static embeddings x_k only")
    p.add_argument("--train-limit", type=count_arg, help="use only the first N training sentences")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--epochs", type=float, default=3.0, help="training epochs (default 3)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per step (default 32)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--embedding-dim", type=int, default=100, help="size of x_k (default 100)")
    p.add_argument("--hidden-size", type=int, default=128, help="BiLSTM size per direction (default 128)")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout on inputs and pooled features (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (weights, data order, dropout)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--max-time", type=duration_arg, default=0.0, help="training time budget, e.g. 20m")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run in --out first")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (for logs)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.errors import EmberError
    from ember.train.elmo_features import run_elmo_features

    if args.train_limit is not None and args.train_limit < 1:
        raise EmberError("--train-limit must be a positive number of sentences")
    from ember.train.loop import use_threads

    use_threads(args.threads or 0)
    result = run_elmo_features(
        args.task, args.out, args.elmo, use_elmo=not args.no_elmo, train_limit=args.train_limit,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        max_time=args.max_time, embedding_dim=args.embedding_dim, hidden_size=args.hidden_size,
        dropout=args.dropout, device=args.device, resume=args.resume, overwrite=args.overwrite,
        progress=not args.no_progress)
    mix = ""
    if "layer_weights" in result:
        mix = f"; layer weights s_j {result['layer_weights']}, gamma {result['gamma']}"
    print(f"{result['task']} dev {result['metric']} {result['best_dev']:.4f} (best at step "
          f"{result['best_step']}, {'ELMo + static' if result['use_elmo'] else 'static only'}){mix}")
    return 0
