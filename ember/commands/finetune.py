"""`ember finetune`: fine-tune on a task (GLUE-style, CoNLL-2003 NER, SQuAD) and keep the best-on-dev weights."""

from __future__ import annotations

import argparse
import textwrap

from ember.commands.common import add_train_options, count_arg, int_list_arg, train_overrides


def register(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune on a classification, NER or question-answering task",
        description=textwrap.fill("Fine-tune a pre-trained (or random) encoder on SST-2, CoLA, MRPC, RTE, STS-B, "
        "QNLI, SNLI (sentence classification/regression), CoNLL-2003 (named entities, entity-level "
        "F1, also reported on test) or SQuAD read from $EMBER_DATA. Defaults are the task's and the family's: "
        "the BERT paper's for encoders (lr 2e-5 - 5e-5 for NER and SQuAD -, batch 32, 3 epochs, 10% warm-up, max "
        "length 128; SQuAD 384 tokens, SQuAD 2.0 2 epochs of batch 48), T5's constant Adafactor at 1e-3, "
        "an LSTM's lr 1e-3. Evaluates on "
        "dev after each epoch and keeps the best weights in OUT/model.safetensors; OUT/results.json "
        "holds the dev metrics. Transfer options: --features (ELMo-style frozen encoder + learned layer mix "
        "+ small head; Transformer encoders), --layer-lr-decay / --schedule stlr / --gradual-unfreeze (ULMFiT; "
        "--ulmfit sets all three; encoders and LSTMs), --patience (early stopping, any run).", 100),
        epilog="examples:\n"
        "  ember finetune --task sst2 --init runs/bert-mini --out runs/sst2 --features\n"
        "  ember finetune --task conll2003 --init runs/bert-mini --out runs/ner --layer-lr-decay 0.8 --patience 2\n"
        "  ember finetune --task sst2 --init runs/bert-mini --out runs/sst2-ulmfit --ulmfit --epochs 6\n"
        "  ember finetune --task sst2 --init runs/minilm --out runs/sst2-kbert --knowledge wordnet.tsv\n"
        "  ember finetune --task classify --train tickets.csv --dev tickets-dev.csv --text-column body \\\n"
        "      --label-column queue --init runs/bert-mini --out runs/tickets\n"
        "  ember finetune --task text2text --train pairs.jsonl --dev pairs-dev.jsonl --init runs/t5-mini \\\n"
        "      --out runs/rewrite        # T5: input -> target texts; exact match, token F1, BLEU, ROUGE",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task",
                   help="sst2, cola, mrpc, rte, stsb, qnli, snli, nsmc, rusentiment, conll2003, squad or squad2 (GPT runs: "
                   "the GLUE-style ones); or your own files: classify, pair, regression (CSV/TSV/JSONL), tag (CoNLL "
                   "columns or JSONL), qa (SQuAD JSON), text2text (input and target texts; T5 runs) with --train and --dev")
    m = p.add_argument_group("multi-task: one shared encoder, a head per task (MT-DNN; docs/multitask.md)")
    m.add_argument("--tasks", help="comma-separated tasks trained together, one task per batch, e.g. sst2,rte,stsb; "
                   "your own files as NAME=KIND:TRAIN:DEV[:TEST][:prefix=TEXT] (KIND classify, pair, regression, "
                   "tag, qa or text2text; TEST scored with the best-on-dev weights; TEXT starts the task's inputs in "
                   "a T5/BART mixture, default NAME); each task's best weights and results (every labelled split) in "
                   "OUT/tasks/NAME, the table in OUT/summary.json")
    m.add_argument("--mixing", choices=["proportional", "temperature", "equal"],
                   help="how each batch's task is drawn (T5 section 3.5.2): proportional to the training sizes capped "
                   "at --mixing-limit (default), those rates ^ 1/--mixing-temperature, or equal")
    m.add_argument("--mixing-limit", type=int, help="K: a task counts at most K examples in the rates (default 2^21)")
    m.add_argument("--mixing-temperature", type=float, help="T >= 1 for --mixing temperature (T5 tried 2, 4, 8)")
    c = p.add_argument_group("your own data (--task classify|pair|regression|tag|qa|text2text)")
    c.add_argument("--train", dest="train", help="training file (.csv, .tsv, .jsonl; tag: CoNLL columns or "
                   ".jsonl; qa: SQuAD .json); its labels are the task's label set")
    c.add_argument("--dev", dest="dev", help="dev file (same layout): picks the best epoch")
    c.add_argument("--test", dest="test", help="test file, scored once with the best-on-dev weights")
    c.add_argument("--text-column", dest="column", help="text column (default: text, sentence, sentence1, review, content or "
                   "document; tag JSONL: tokens or words; text2text: the input, default input, inputs, source, text, "
                   "document or question)")
    c.add_argument("--text-pair-column", dest="pair_column", help="second text column for pair/regression (default: text_pair, "
                   "sentence2, hypothesis, ... beside its first)")
    c.add_argument("--label-column", help="label column (default: label, labels, score or target; tag JSONL: "
                   "tags or ner_tags; text2text: the target text, default target, targets, output, summary, "
                   "answer or label)")
    p.add_argument("--init", default="random",
                   help="pre-training run folder, HF checkpoint folder, or 'random' (default)")
    p.add_argument("--model", default="", help="model preset for --init random (e.g. bert-mini)")
    p.add_argument("--tokenizer", default="", help="tokenizer.json for --init random")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the task's BERT value; a T5 run: "
                   "1e-3 with Adafactor, T5's; an LSTM run: 1e-3)")
    p.add_argument("--epochs", type=float, help="training epochs; fractions work (default: the task's: 3; SQuAD 2.0: 2)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default: the task's: 32; SQuAD 2.0: 48)")
    p.add_argument("--max-length", type=int,
                   help="max tokens per example (default: the task's: 128; SQuAD 384; a T5 run on SQuAD 512)")
    p.add_argument("--warmup-ratio", type=float,
                   help="fraction of steps for LR warm-up (default 0.1; a T5 run: 0, as its constant Adafactor; "
                   "--schedule stlr has its own rise)")
    p.add_argument("--seeds", type=int_list_arg, default=None, help="comma-separated seeds, e.g. 1,2,3: one run each, "
                   "mean and std reported (overrides --seed)")
    p.add_argument("--train-split", help="split to train on (default train) or a TSV file in the task's layout; SNLI "
                   "and QNLI have no train split here: SNLI takes --train-split dev --eval-split test, QNLI a "
                   "file (`ember glue` does both itself)")
    p.add_argument("--eval-split", help="split to select and report on (default dev)")
    p.add_argument("--train-limit", type=count_arg, help="use only the first N training examples (quick runs)")
    g = p.add_argument_group("transfer options (--features: Transformer encoders; ULMFiT's: encoders and LSTMs)")
    g.add_argument("--features", action="store_true",
                   help="feature-based transfer (ELMo): freeze the encoder, learn a softmax-weighted mix of "
                   "its layers (reported in results.json) and a small head on top")
    g.add_argument("--feature-layers", type=int,
                   help="with --features: per-token GELU layers between the mix and the head (default 1; 0 = "
                   "linear probe)")
    g.add_argument("--feature-combine", choices=["mix", "embeddings", "second-to-last", "last", "sum-last-4",
                                                  "concat-last-4"],
                   help="with --features: which hidden states (default mix, the learned weighted sum of all; the "
                   "others are the fixed choices of the BERT paper's Table 7)")
    g.add_argument("--layer-lr-decay", type=float,
                   help="discriminative fine-tuning: the head gets --lr, the top layer lr*X, the next lr*X^2, "
                   "..., the embeddings lr*X^(L+1) (e.g. 0.8; ULMFiT's 'divide by 2.6' is 0.385)")
    g.add_argument("--schedule", choices=["linear", "constant", "stlr"],
                   help="lr schedule: linear warm-up/decay (BERT, default), constant after warm-up (T5's default), or stlr "
                   "(ULMFiT slanted triangular: rise over 10%% of steps, decay to lr/32)")
    g.add_argument("--gradual-unfreeze", action="store_true",
                   help="epoch 1 trains the head and the top layer, each further epoch one more layer down, "
                   "embeddings last (all layers train from epoch L+1 on)")
    g.add_argument("--ulmfit", action="store_true",
                   help="ULMFiT preset: --layer-lr-decay 0.385 (1/2.6) --schedule stlr --gradual-unfreeze "
                   "(explicit flags win)")
    g.add_argument("--patience", type=int,
                   help="early stopping: stop after N dev evaluations without a better main metric "
                   "(the best weights are kept either way)")
    k = p.add_argument_group("knowledge graphs (any encoder; sentence classification and tagging; docs/knowledge.md)")
    k.add_argument("--knowledge", metavar="TRIPLES",
                   help="K-BERT: inject triples of this file (head<TAB>relation<TAB>tail, e.g. from `ember kg "
                   "build --wordnet`) after each entity found in a sentence, with soft positions and a visible matrix")
    k.add_argument("--relations", help="with --knowledge: only these relations (comma-separated, e.g. is_a,part_of)")
    k.add_argument("--max-triples", type=int, help="with --knowledge: at most K triples per entity (default 2)")
    k.add_argument("--entities", metavar="DIR",
                   help="ERNIE: fuse these entity embeddings (`ember kg embed`, or OpenKE's entity2id.txt + "
                   "entity2vec.vec) into the top encoder layers, aligned to each mention's first token")
    k.add_argument("--fusion-layers", type=int, help="with --entities: top layers with a fusion layer (default: half)")
    add_train_options(p)
    p.set_defaults(run=run)


def settings_from_args(args) -> dict:
    """The keyword settings of ``ember.finetune`` given on the command line (None = not given)."""
    names = ("lr", "batch_size", "epochs", "max_length", "warmup_ratio", "train_split", "eval_split",
             "feature_layers", "feature_combine", "layer_lr_decay", "schedule", "patience", "knowledge", "relations", "max_triples",
             "entities", "fusion_layers", "mixing", "mixing_limit", "mixing_temperature")
    settings = {name: getattr(args, name) for name in names}
    settings.update(features=args.features or None, gradual_unfreeze=args.gradual_unfreeze or None)
    return settings


def data_from_args(args) -> dict:
    """Your own data's files and columns (--train/--dev/--test/--text-column/...), as ember.finetune names them."""
    return {name: getattr(args, name) for name in ("train", "dev", "test", "column", "pair_column", "label_column")}


def run(args) -> int:
    from ember.api import finetune
    from ember.errors import EmberError

    if bool(args.task) == bool(args.tasks):
        raise EmberError("ember finetune takes --task NAME (one task) or --tasks A,B,... (several, one encoder)")
    if args.tasks and any(v is not None for v in data_from_args(args).values()):
        raise EmberError("--train/--dev/--test and the column options are for one --task; in --tasks your own files "
                         "are NAME=KIND:TRAIN:DEV[:TEST]")
    finetune(args.task or "", args.out, tasks=args.tasks or None, init=args.init, model=args.model,
             tokenizer=args.tokenizer, seeds=args.seeds,
             train_limit=args.train_limit, overrides=train_overrides(args), resume=args.resume,
             overwrite=args.overwrite, progress=not args.no_progress, ulmfit=args.ulmfit,
             **({} if args.tasks else data_from_args(args)), **settings_from_args(args))
    return 0
