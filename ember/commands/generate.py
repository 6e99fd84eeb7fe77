"""`ember generate`: continue prompts with a GPT-1/GPT-2 run, or turn input texts into output texts
with a T5 run (greedy, sampled or beam search)."""

from __future__ import annotations

import argparse

from ember.commands.common import count_arg

HELP = """\
Continue text with a causal LM run folder (from `ember pretrain --recipe gpt2-*` or a GPT-2 /
OpenAI GPT checkpoint imported with `ember convert --from-hf`). Greedy by default; a
--temperature above 0 samples, optionally from the --top-k most likely tokens and/or the
smallest set reaching probability --top-p (either of which samples at temperature 1 when
--temperature is not above 0). Each prompt stops at end-of-text, at a --stop
sequence (cut off) or after --max-new-tokens. Many prompts (--prompts-file, one per line,
or JSONL with a "prompt" field) run in batches, left-padded, with a key/value cache.

--tldr: summarise each input as in the GPT-2 paper (§3.6): appends "\\nTL;DR:" to the text,
samples 100 tokens with top-k 2 (unless set) and keeps the first three sentences.

A T5 run (pre-trained with `ember pretrain --recipe t5-*`, fine-tuned text to text, or imported
with `ember convert --from-hf`) maps each --input (or --prompt) text to an output text, as
ember.seq2seq_generation.seq2seq_generate_text does: the input is encoded with the tokenizer's
template (T5 appends </s>), the decoder starts from <pad> and stops at </s>. --num-beams > 1 is
beam search (Raffel et al. 2020 §3.7: 4 beams, --length-penalty 0.6), optionally with
--early-stopping; sampling options work as for GPT. A fine-tuned run wants its task's input
format, e.g. "sst2 sentence: ..." (docs/t5.md). A BART run (docs/bart.md) works the same way,
decoding from </s> (its decoder start); --min-new-tokens, --no-repeat-ngram-size and
--forced-eos are the constraints BART's summaries used (any encoder-decoder accepts them).

examples:
  ember generate runs/gpt2-tiny --prompt "The history of the city" --max-new-tokens 40
  ember generate runs/gpt2-tiny --prompt "In 1850," --temperature 0.8 --top-p 0.9 --seed 3
  ember generate runs/gpt2-tiny --prompts-file prompts.txt --out completions.jsonl
  ember generate runs/gpt2-tiny --tldr --prompts-file articles.jsonl
  ember generate runs/t5-sst2 --input "sst2 sentence: a gem of a film" --max-new-tokens 5
  ember generate runs/t5-mini --input "The <extra_id_0> of France is Paris." --num-beams 4 --length-penalty 0.6
  ember generate runs/bart-mini --input "The <mask> of France is Paris." --num-beams 4 --no-repeat-ngram-size 3
"""


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a GPT-style causal LM or a T5 / BART model",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="run folder of a gpt/gpt2, t5 or bart model")
    p.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable; a T5 run's input; \\n = newline, for few-shot layouts)")
    p.add_argument("--input", action="append", default=[], metavar="TEXT",
                   help="input text of a T5 run (repeatable; the same as --prompt there, \\n = newline)")
    p.add_argument("--prompts-file", metavar="FILE",
                   help="prompts, one per line (.txt) or JSON objects with a \"prompt\" field (.jsonl)")
    p.add_argument("--max-new-tokens", type=int, help="tokens to generate per prompt (default 50; 100 with --tldr)")
    p.add_argument("--temperature", type=float,
                   help="0 = greedy (default); > 0 samples from softmax(logits / T)")
    p.add_argument("--top-k", type=int, help="sample only from the k most likely tokens (implies sampling)")
    p.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with probability >= p (implies sampling)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop a continuation at this text, which is cut off (repeatable; \\n = newline)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--tldr", action="store_true", help="GPT-2's TL;DR: summarisation prompt (see above)")
    p.add_argument("--num-beams", type=count_arg, help="T5: beam search with this many beams (default 1: greedy)")
    p.add_argument("--length-penalty", type=float,
                   help="T5 beam search: score = sum log p / length^penalty (default 1.0; T5 used 0.6)")
    p.add_argument("--early-stopping", action="store_true",
                   help="T5 beam search: stop an input once it has --num-beams finished hypotheses")
    p.add_argument("--min-new-tokens", type=int,
                   help="T5/BART: </s> is forbidden before this many new tokens (default 0)")
    p.add_argument("--no-repeat-ngram-size", type=int,
                   help="T5/BART: never generate an n-gram of this size twice (default 0: off; BART's CNN/DM: 3)")
    p.add_argument("--forced-eos", action="store_true",
                   help="T5/BART: the --max-new-tokens-th token is </s> (transformers' forced_eos_token_id)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per batch (default 8)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--out", help="write JSONL {prompt, completion} (T5: {input, output}) here instead of printing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def read_prompts(path: str) -> list[str]:
    """Prompts from a text file (one per non-empty line) or JSONL ("prompt" or "text" field)."""
    import json
    from pathlib import Path

    from ember.errors import EmberError

    path = Path(path)
    if not path.is_file():
        raise EmberError(f"prompts file not found: {path}")
    prompts = []
    from ember.tasks.readers.glue import _lines  # strict UTF-8 with file:line errors; a BOM and CRLF are dropped

    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
                prompts.append(str(row["prompt"] if "prompt" in row else row["text"]))
            except (ValueError, KeyError, TypeError):
                raise EmberError(f"{path}:{n}: expected a JSON object with a \"prompt\" (or \"text\") "
                                 "field") from None
        else:
            prompts.append(_newlines(line))
    return prompts


def _newlines(text: str) -> str:
    return text.replace("\\n", "\n")


BEAM_OPTIONS = ("num_beams", "length_penalty", "early_stopping", "min_new_tokens", "no_repeat_ngram_size", "forced_eos")
TLDR = {"max_new_tokens": 100, "temperature": 1.0, "top_k": 2}  # GPT-2 §3.6, unless set


def sampling_settings(args, defaults: dict | None = None) -> dict:
    """The GenerationConfig settings both kinds of model take from the command line (over ``defaults``)."""
    settings = {"seed": args.seed, "stop": tuple(map(_newlines, args.stop)), **(defaults or {})}
    for name in ("max_new_tokens", "temperature", "top_k", "top_p"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    if (args.top_k or (args.top_p or 1.0) < 1.0) and not settings.get("temperature"):
        settings["temperature"] = 1.0  # a top-k / top-p cut only means something when sampling
    return settings


def run(args) -> int:
    from ember.config import DECODER_FAMILIES, ENCODER_FAMILIES, SEQ2SEQ_FAMILIES
    from ember.errors import EmberError
    from ember.runs.folder import load_run_config

    family = load_run_config(args.run_dir).model.family
    if family not in DECODER_FAMILIES + SEQ2SEQ_FAMILIES:
        masked = "; an encoder fills in [MASK]s with `ember fill-mask`" if family in ENCODER_FAMILIES else ""
        raise EmberError(f"{args.run_dir} holds a {family} model; ember generate writes text with GPT runs (--prompt) "
                         f"and T5 runs (--input){masked}")
    from_file = read_prompts(args.prompts_file) if args.prompts_file else []  # an empty file: "file is empty"
    # A shell argument cannot hold a newline without $'...' quoting: "\n" in one is a newline, as in --stop.
    prompts = [_newlines(p) for p in list(args.prompt) + list(args.input)] + from_file
    if not prompts:
        raise EmberError("no prompts: pass --prompt TEXT (T5: --input TEXT) or --prompts-file FILE")
    if args.batch_size < 1:
        raise EmberError("--batch-size must be at least 1")
    seq2seq = family in SEQ2SEQ_FAMILIES
    if seq2seq:
        if args.tldr:
            raise EmberError("--tldr is GPT-2's prompt trick (it continues 'TL;DR:'); a T5 run maps an input to an "
                             "output: fine-tune it on summaries, or give the input as --input")
        return _run_seq2seq(args, prompts)
    used = [name for name in BEAM_OPTIONS if getattr(args, name) not in (None, False)]
    if args.input or used:
        what = "--input" if args.input else "--" + used[0].replace("_", "-")
        raise EmberError(f"{what} is for T5 (encoder-decoder) runs; {args.run_dir} holds a causal LM, which "
                         "continues --prompt text greedily or by sampling")
    return _run_causal(args, prompts)


def _batches(args, n: int):
    batches = range(0, n, args.batch_size)
    if not args.no_progress and len(batches) > 1:
        from tqdm import tqdm

        batches = tqdm(batches, unit="batch")
    return batches


def _write(args, rows: list[dict]) -> None:
    import json
    from pathlib import Path

    from ember.runs.checkpoint import atomic_write_text

    atomic_write_text(Path(args.out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} completions to {args.out}")


def _run_causal(args, prompts: list[str]) -> int:
    from ember.generate import GenerationConfig, generate_text, load_causal_lm

    cfg = GenerationConfig(**sampling_settings(args, TLDR if args.tldr else None))
    model, tokenizer = load_causal_lm(args.run_dir, args.device)
    completions = []
    for start in _batches(args, len(prompts)):
        completions += generate_text(model, tokenizer, prompts[start : start + args.batch_size], cfg,
                                     tldr=args.tldr)
    if args.out:
        _write(args, [{"prompt": p, "completion": c} for p, c in zip(prompts, completions)])
    else:
        for p, c in zip(prompts, completions):
            print(f"TL;DR: {c}" if args.tldr else p + c)  # the continuation follows the prompt
            print()
    return 0


def _run_seq2seq(args, inputs: list[str]) -> int:
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, load_seq2seq_lm, seq2seq_generate_text

    beams = {name: getattr(args, name) for name in BEAM_OPTIONS if getattr(args, name) not in (None, False)}
    cfg = Seq2SeqGenerationConfig(**sampling_settings(args), **beams)
    model, tokenizer = load_seq2seq_lm(args.run_dir, args.device)
    outputs = []
    for start in _batches(args, len(inputs)):
        outputs += seq2seq_generate_text(model, tokenizer, inputs[start : start + args.batch_size], cfg)
    if args.out:
        _write(args, [{"input": i, "output": o} for i, o in zip(inputs, outputs)])
    else:
        for o in outputs:
            print(o)  # one output per input, in order (an output is not a continuation of its input)
    return 0
