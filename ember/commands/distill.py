"""`ember distill`: teach a small student from a large teacher (KD, DistilBERT, TinyBERT, PKD)."""

from __future__ import annotations


from ember.commands.common import add_train_options, count_arg, stopped_line, train_overrides

EXAMPLES = """examples:
  # Hinton KD: a fine-tuned SST-2 teacher labels 50k Wikipedia sentences + SST-2 train text
  ember distill --method kd --teacher runs/sst2-teacher --student bert-tiny \\
      --unlabeled $EMBER_DATA/wiki-en/AA task --max-unlabeled 50000 --out runs/sst2-kd
  # Patient KD (skip), student = every other teacher layer (DistilBERT-style init)
  ember distill --method pkd --pkd-strategy skip --teacher runs/sst2-teacher \\
      --student-init teacher --student-layers 2 --out runs/sst2-pkd
  # TinyBERT task stage (intermediate layers, then predictions)
  ember distill --method tinybert --stage task --teacher runs/sst2-teacher --student bert-tiny \\
      --unlabeled task --out runs/sst2-tinybert
  # DistilBERT / TinyBERT general stage on a prepared corpus, teacher = a pre-training run
  ember distill --method distilbert --teacher runs/bert-mini --data prepared/wiki --out runs/distil-mini
  ember distill --method tinybert --stage general --teacher runs/bert-mini --student bert-tiny \\
      --data prepared/wiki --out runs/tinybert-general
"""


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "distill", help="distil a teacher into a smaller student (KD, DistilBERT, TinyBERT, Patient KD)",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Task-level methods (kd, pkd, tinybert --stage task) take a fine-tuned teacher run "
        "(`ember finetune`) and write a fine-tuned student run that `ember evaluate`/`predict` read; "
        "results.json has the student's and the teacher's dev metrics, the retained fraction and the "
        "dev agreement. Corpus-level methods (distilbert, tinybert --stage general) take a pre-trained "
        "teacher run and a prepared corpus and write a pre-training run for `ember finetune --init`.")
    p.add_argument("--method", required=True, choices=["kd", "distilbert", "tinybert", "pkd"],
                   help="kd: Hinton soft targets; distilbert: MLM triple loss on a corpus; tinybert: "
                   "embeddings/hidden/attention MSE then predictions; pkd: Patient KD")
    p.add_argument("--teacher", required=True, help="teacher run folder (fine-tuned; pre-trained for "
                   "distilbert and tinybert --stage general)")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--stage", choices=["task", "general"], default="task",
                   help="tinybert: task (default; fine-tuned teacher) or general (pre-trained teacher, --data)")
    g = p.add_argument_group("student")
    g.add_argument("--student", default="", help="student preset, e.g. bert-tiny, bert-mini (default: "
                   "the teacher's shape)")
    g.add_argument("--student-layers", type=int, default=0, help="student depth (default: the preset's; "
                   "distilbert: half the teacher's)")
    g.add_argument("--student-init", default="", help="random (default), teacher (every other teacher "
                   "layer + embeddings, DistilBERT-style; default for distilbert), or a pre-trained run folder")
    g = p.add_argument_group("transfer set (task-level methods)")
    g.add_argument("--unlabeled", nargs="+", default=[], metavar="PATH|task",
                   help="text files/folders (wiki, plain text, lines, JSONL), split into sentences, and/or "
                   "'task' for the task's training text without labels")
    g.add_argument("--max-unlabeled", type=int, default=100_000, help="at most this many sentences from files (default 100,000)")
    g.add_argument("--train-limit", type=count_arg, help="use only the first N task training examples (with "
                   "gold labels when alpha < 1)")
    g.add_argument("--task-unlabeled", type=int, help="with --unlabeled task: the first N training examples "
                   "as unlabeled text (default: --train-limit); those past --train-limit carry no label")
    g.add_argument("--logits-cache", help="file for the teacher's soft targets (default OUT/teacher-logits.npz); "
                   "share one between students of the same teacher and transfer set")
    g = p.add_argument_group("losses")
    g.add_argument("--temperature", type=float, help="softmax temperature T (defaults: kd 2, pkd 5, tinybert 1, "
                   "distilbert 2; tinybert's general stage matches hidden states and attentions, no logits)")
    g.add_argument("--alpha", type=float, help="weight of the soft loss; 1 - alpha weighs the gold-label loss "
                   "on the labelled training set (defaults: kd 1, pkd 0.5, tinybert 1)")
    g.add_argument("--soft-loss", choices=["ce", "mse"], default="ce",
                   help="soft cross-entropy with T^2 scaling (default) or MSE on logits")
    g.add_argument("--beta", type=float, default=100.0, help="pkd: weight of the patience loss (default 100)")
    g.add_argument("--pkd-strategy", choices=["skip", "last"], default="skip",
                   help="pkd: teacher layers k, 2k, ... (skip, the default) or the last ones (last)")
    g.add_argument("--ce-weight", type=float, default=5.0, help="distilbert: soft-target weight (5)")
    g.add_argument("--mlm-weight", type=float, default=2.0, help="distilbert: MLM weight (2)")
    g.add_argument("--cos-weight", type=float, default=1.0, help="distilbert: cosine weight (1)")
    g = p.add_argument_group("training")
    g.add_argument("--data", help="prepared corpus (`ember prepare`) for distilbert / tinybert --stage general")
    g.add_argument("--epochs", type=float, default=3.0, help="task-level: epochs over the transfer set (3)")
    g.add_argument("--intermediate-epochs", type=float,
                   help="tinybert task stage: epochs of intermediate-layer distillation (default: --epochs)")
    g.add_argument("--max-steps", type=int, help="corpus-level: optimizer steps (default 10000)")
    g.add_argument("--lr", type=float, help="peak learning rate (task 5e-5, corpus 5e-4)")
    g.add_argument("--batch-size", type=int, help="sequences per step (32)")
    g.add_argument("--warmup-ratio", type=float, help="fraction of steps for warm-up (task 0.1, corpus 0.01)")
    add_train_options(p, overridable="a train.* setting (the other sections are not used here)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.api import distill
    from ember.api.distill import is_corpus_level

    corpus_level = is_corpus_level(args.method, args.stage)
    names = ("student", "student_layers", "temperature") + (() if corpus_level else (
        "max_unlabeled", "train_limit", "task_unlabeled", "alpha", "soft_loss", "beta", "pkd_strategy", "epochs",
        "intermediate_epochs", "logits_cache"))
    options = {name: getattr(args, name) for name in names}
    options["student_init"] = args.student_init or None  # None: the method's default
    result = distill(args.method, args.teacher, args.out, stage=args.stage, data=args.data, unlabeled=args.unlabeled,
                     overrides=train_overrides(args), lr=args.lr, batch_size=args.batch_size,
                     warmup_ratio=args.warmup_ratio, max_steps=args.max_steps,
                     distilbert_weights=(args.ce_weight, args.mlm_weight, args.cos_weight), resume=args.resume,
                     overwrite=args.overwrite, progress=not args.no_progress, **options)
    r = result.result
    if corpus_level:
        print(stopped_line(result, args.out))
        return 0
    main = next(iter(r["metrics"]))
    line = "  ".join(f"{k}={v:.4f}" for k, v in r["metrics"].items())
    print(f"{r['task']} {r['split']} student: {line}; teacher {main}={r['teacher_metrics'][main]:.4f}"
          + (f"; retained {r['retained']:.1%}" if r.get("retained") else "")
          + (f"; agreement {r['dev_agreement']:.1%}" if "dev_agreement" in r else "")
          + f"; parameters {r['parameters']['student'] / 1e6:.2f}M vs {r['parameters']['teacher'] / 1e6:.2f}M")
    return 0
