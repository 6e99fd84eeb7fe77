"""`ember pretrain`: pre-train a model from a recipe on a prepared corpus."""

from __future__ import annotations

from ember.commands.common import add_train_options, stopped_line, train_overrides


def register(sub) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pre-train BERT, RoBERTa, ALBERT, ELECTRA, GPT, XLNet, XLM, T5, ... on a prepared corpus",
        description="Pre-train from a recipe (ember/recipes/*.yaml or a path) on token shards "
        "written by `ember prepare`. Writes a run folder with config, tokenizer, checkpoints, "
        "metrics.jsonl, TensorBoard events and curves.png. Runs under torchrun for DDP. "
        "Recipes: BERT bert-tiny, bert-mini, bert-small, bert-medium, bert-base, bert-large, bert-cram-cpu "
        "(one CPU-hour from scratch); whole-word and ERNIE phrase masking bert-mini-wwm, ernie-mini; "
        "roberta-mini, roberta-base; albert-mini, albert-base; spanbert-mini; electra-mini, electra-small; "
        "distilbert; causal LMs gpt1, gpt1-mini, gpt2-tiny, gpt2-mini; XLNet (permutation LM) xlnet-mini, "
        "xlnet-base; XLM (MLM/TLM over languages, docs/xlm.md) xlm-mini; T5 (span corruption, docs/t5.md) "
        "t5-tiny, t5-mini, t5-small, t5-base; BART (denoising, docs/bart.md) bart-mini, bart-base; MASS mass-mini; Dai & Le's LSTMs (docs/lstm.md) lm-lstm, sa-lstm; ELMo "
        "elmo-mini; ERNIE's dEA on an existing encoder (docs/knowledge.md) ernie-dea. ELMo and ernie-dea read "
        "raw text instead of shards: `ember pretrain --recipe elmo-mini --data ../shared/data/wiki-en --out "
        "runs/elmo --max-time 15m`. With --max-time a linear (or stlr) learning-rate schedule still spans the "
        "recipe's max_steps; --set train.schedule=time spans the time budget instead (bert-cram-cpu's "
        "recipe does; T5's inverse_sqrt does not depend on max_steps). "
        "Continued pre-training (Longformer §5, DAPT; docs/pretraining.md): --init RUN_OR_CHECKPOINT starts "
        "from a trained model instead of random weights (an ember run, RUN/checkpoints/step-N or an HF folder, "
        "e.g. a model made long with `ember convert --long`): its config (attention, window, positions, ...), "
        "weights and tokenizer, its objective's heads when it has them (else fresh ones), its embedding.json, a "
        "fresh optimizer and schedule. Each family continues with its own objective and recipe unless --recipe "
        "names another that fits (its model section is ignored): encoders continue-mlm (mlm), gpt gpt1-mini and "
        "gpt2 gpt2-mini (clm), t5 t5-mini (span_corruption), bart bart-mini (a MASS run mass-mini), xlnet "
        "xlnet-mini (plm), xlm xlm-mini (xlm_mlm; with parallel pairs xlm_mlm_tlm), lstm lm-lstm (an SA-LSTM "
        "run sa-lstm). --set model.dropout and the other settings that keep the weights' meaning apply (an "
        "XLNet's model.mem_len too), others are refused. --data must be prepared with the init's tokenizer: "
        "`ember prepare ../shared/data/wiki-en --tokenizer runs/minilm-long/tokenizer.json --out "
        "runs/wiki-minilm`, then `ember pretrain --init runs/minilm-long --data runs/wiki-minilm --out "
        "runs/minilm-long-mlm` (continue-mlm: sequences as long as the model's positions; a recipe's longer "
        "length is cut to them; data.max_seq_length to choose).",
    )
    p.add_argument("--recipe", help="recipe name or YAML path (default: bert-mini; with --init the init's family's: "
                   "continue-mlm for an encoder, gpt2-mini, t5-mini, bart-mini, xlnet-mini, xlm-mini, ...; "
                   "with --resume, the run's saved settings)")
    p.add_argument("--init", metavar="RUN_OR_CHECKPOINT", help="continue pre-training this model (an ember run, "
                   "one of its checkpoints or an HF folder) with its family's objective: its config, weights, "
                   "heads, tokenizer and embedding.json, a fresh optimizer and schedule")
    p.add_argument("--data", help="prepared corpus folder (from `ember prepare`); for "
                   "ELMo (objective bilm) and ernie-dea raw text: a file, folder or glob")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--max-steps", type=int, help="optimizer steps (a linear or stlr LR schedule spans these)")
    p.add_argument("--batch-size", type=int, help="sequences per optimizer step, over all ranks")
    p.add_argument("--grad-accum", type=int, help="micro-batches accumulated per step")
    p.add_argument("--lr", type=float, help="peak learning rate")
    add_train_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ember.api import pretrain

    overrides = train_overrides(args)
    for flag, key in (("max_steps", "train.max_steps"), ("batch_size", "train.batch_size"),
                      ("grad_accum", "train.grad_accum"), ("lr", "train.lr")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    result = pretrain(args.recipe, args.out, data=args.data, overrides=overrides, resume=args.resume,
                      overwrite=args.overwrite, progress=not args.no_progress, init=args.init)
    from ember.train.distributed import is_first_process

    if is_first_process():
        print(stopped_line(result, args.out))
    return 0
