"""`ember generate`: continue prompts with a GPT-1/GPT-2 run (greedy or sampled)."""

from __future__ import annotations

import argparse

HELP = """\
Continue text with a causal LM run folder (from `ember pretrain --recipe gpt2-*` or a GPT-2 /
OpenAI GPT checkpoint imported with `ember convert --from-hf`). Greedy by default; a
--temperature above 0 samples, optionally from the --top-k most likely tokens and/or the
smallest set reaching probability --top-p. Each prompt stops at end-of-text, at a --stop
sequence (cut off) or after --max-new-tokens. Many prompts (--prompts-file, one per line,
or JSONL with a "prompt" field) run in batches, left-padded, with a key/value cache.

--tldr: summarise each input as in the GPT-2 paper (§3.6): appends "\\nTL;DR:" to the text,
samples 100 tokens with top-k 2 (unless set) and keeps the first three sentences.

examples:
  ember generate runs/gpt2-tiny --prompt "The history of the city" --max-new-tokens 40
  ember generate runs/gpt2-tiny --prompt "In 1850," --temperature 0.8 --top-p 0.9 --seed 3
  ember generate runs/gpt2-tiny --prompts-file prompts.txt --out completions.jsonl
  ember generate runs/gpt2-tiny --tldr --prompts-file articles.jsonl
"""


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a GPT-style causal LM", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="run folder of a gpt/gpt2 model")
    p.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable)")
    p.add_argument("--prompts-file", metavar="FILE",
                   help="prompts, one per line (.txt) or JSON objects with a \"prompt\" field (.jsonl)")
    p.add_argument("--max-new-tokens", type=int, help="tokens to generate per prompt (default 50; 100 with --tldr)")
    p.add_argument("--temperature", type=float,
                   help="0 = greedy (default); > 0 samples from softmax(logits / T)")
    p.add_argument("--top-k", type=int, help="sample only from the k most likely tokens (implies sampling)")
    p.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with probability >= p")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop a continuation at this text, which is cut off (repeatable; \\n = newline)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--tldr", action="store_true", help="GPT-2's TL;DR: summarisation prompt (see above)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per batch (default 8)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--out", help="write JSONL {prompt, completion} here instead of printing")
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
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
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
            prompts.append(line.replace("\\n", "\n"))
    return prompts


def run(args) -> int:
    import json

    from ember.errors import EmberError
    from ember.generate import GenerationConfig, generate_text, load_causal_lm

    prompts = list(args.prompt) + (read_prompts(args.prompts_file) if args.prompts_file else [])
    if not prompts:
        raise EmberError("no prompts: pass --prompt TEXT or --prompts-file FILE")
    settings = {"seed": args.seed, "stop": tuple(s.replace("\\n", "\n") for s in args.stop)}
    if args.tldr:
        settings.update(max_new_tokens=100, temperature=1.0, top_k=2)
    for name in ("max_new_tokens", "temperature", "top_k", "top_p"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    if (args.top_k or (args.top_p or 1.0) < 1.0) and not settings.get("temperature"):
        settings["temperature"] = 1.0  # a top-k / top-p cut only means something when sampling
    cfg = GenerationConfig(**settings)
    if args.batch_size < 1:
        raise EmberError("--batch-size must be at least 1")
    model, tokenizer = load_causal_lm(args.run_dir, args.device)
    batches = range(0, len(prompts), args.batch_size)
    if not args.no_progress and len(batches) > 1:
        from tqdm import tqdm

        batches = tqdm(batches, unit="batch")
    completions = []
    for start in batches:
        completions += generate_text(model, tokenizer, prompts[start : start + args.batch_size], cfg,
                                     tldr=args.tldr)
    if args.out:
        from pathlib import Path

        from ember.runs.checkpoint import atomic_write_text

        rows = [{"prompt": p, "completion": c} for p, c in zip(prompts, completions)]
        atomic_write_text(Path(args.out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"wrote {len(rows)} completions to {args.out}")
    else:
        for p, c in zip(prompts, completions):
            print(f"TL;DR: {c}" if args.tldr else p + c)  # the continuation follows the prompt
            print()
    return 0
