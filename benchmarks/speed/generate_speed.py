"""Decoding speed: ember's generation against transformers' ``generate`` on the same weights.

Each family's model is built from a random ember config (a preset's shape), copied into the
transformers class through ember's interop (``family_step.to_transformers``), and both sides
decode the same inputs; the tokens are checked equal before any time is reported.

  gpt2  gpt2-small shape (12 x 768, vocabulary 50,257): a 32-token prompt -> 64 new tokens
  t5    t5-small shape (6 + 6 x 512, vocabulary 32,128): a 128-token input -> 32 new tokens
  bart  bart-base shape (6 + 6 x 768, vocabulary 50,265): a 128-token input -> 32 new tokens

Modes, at batch 1 and batch 8: greedy; sampling (temperature 1, top-k 50, seed 0: both sides
filter the logits alike, take softmax and draw with ``torch.multinomial`` from a generator seeded
alike, so the tokens must match too); beam 4 (T5 and BART; ember has no beam search for GPT).
End-of-text cannot end a row early (GPT-2: ember ignores it and transformers has no eos id;
T5 / BART: </s> is forbidden until the last token on both sides, ``min_new_tokens``), so both
decode the full length. Times are CPU seconds of this process on one thread, alternated
repetitions, medians; the ratio is transformers' time / ember's (> 1: ember is faster).

``--serve``: a GPT-2 run of the same shape (its vocabulary a BPE trained on a few sentences, so
8,000 or fewer) served by a real ``ember serve`` process (1 thread); /generate does not stream,
so time-to-first-token is the latency of a 1-token request and the per-token latency is that of
an N-token request less the median 1-token latency, over N - 1 (p50 and p99 over requests).

    python benchmarks/speed/generate_speed.py                 # all three families, ~8 CPU minutes
    python benchmarks/speed/generate_speed.py --families gpt2 --serve
    python benchmarks/speed/generate_speed.py --tiny --serve  # seconds: the smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's ember
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # the shared helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # family_step (the interop copy)
from _bench import load, machine, median  # noqa: E402
from family_step import to_transformers  # noqa: E402

from ember.config import model_preset  # noqa: E402
from ember.generate import GenerationConfig, generate_ids  # noqa: E402
from ember.models import build_backbone  # noqa: E402
from ember.models.decoder import CausalLM  # noqa: E402
from ember.seq2seq_generation import Seq2SeqGenerationConfig, seq2seq_generate  # noqa: E402

# family -> (preset, vocabulary, input tokens, new tokens); --tiny: the smoke sizes
SHAPES = {"gpt2": ("gpt2-small", 50257, 32, 64), "t5": ("t5-small", 32128, 128, 32),
          "bart": ("bart-base", 50265, 128, 32)}
TINY = {"gpt2": ("gpt2-tiny", 500, 8, 6), "t5": ("t5-tiny", 500, 12, 5), "bart": ("bart-tiny", 500, 12, 5)}
SAMPLING = {"temperature": 1.0, "top_k": 50, "seed": 0}


def build(family: str, preset: str, vocab: int, seed: int = 0):
    """(ember model, transformers model) with the same random weights, both in eval mode."""
    torch.manual_seed(seed)
    backbone = build_backbone(dataclasses.replace(model_preset(preset), vocab_size=vocab, dropout=0.0,
                                                  attention_dropout=0.0))
    hf = to_transformers(backbone).eval()
    # ember's settings (no forced tokens, no n-gram ban) on transformers' side too, whatever its
    # config class defaults to (BartConfig forces </s> last)
    hf.generation_config.update(forced_eos_token_id=None, forced_bos_token_id=None, no_repeat_ngram_size=0)
    ours = CausalLM(backbone) if family == "gpt2" else backbone
    return ours.eval(), hf


def cases(family: str, batches: tuple[int, ...], modes: tuple[str, ...]) -> list[tuple[int, str]]:
    """(batch, mode) pairs to time; GPT has no beam search in ember."""
    return [(b, m) for b in batches for m in modes if not (family == "gpt2" and m == "beam4")]


def runners(family: str, ours, hf, inputs: torch.Tensor, new: int, mode: str):
    """(ember's decode, transformers' decode): each returns the new tokens as lists."""
    sampling = SAMPLING if mode == "sample" else {}
    beams = 4 if mode == "beam4" else 1
    if family == "gpt2":
        eot = ours.backbone.config.vocab_size - 1
        cfg = GenerationConfig(max_new_tokens=new, stop_at_eot=False, **sampling)
        prompts = inputs.tolist()

        def ember():
            return generate_ids(ours, prompts, cfg, eot)

        def reference():
            torch.manual_seed(cfg.seed)  # transformers draws from the default generator
            out = hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=new,
                              do_sample=mode == "sample", top_k=sampling.get("top_k", 0) or None, eos_token_id=None,
                              pad_token_id=eot)
            return out[:, inputs.shape[1]:].tolist()
        return ember, reference
    eos, mask = hf.config.eos_token_id, torch.ones_like(inputs)
    cfg = Seq2SeqGenerationConfig(max_new_tokens=new, num_beams=beams, min_new_tokens=new - 1, **sampling)

    def ember():
        return seq2seq_generate(ours, inputs, mask, cfg, eos)

    def reference():
        torch.manual_seed(cfg.seed)
        out = hf.generate(input_ids=inputs, attention_mask=mask, max_new_tokens=new, min_new_tokens=new - 1,
                          num_beams=beams, do_sample=mode == "sample", top_k=sampling.get("top_k", 0) or None,
                          early_stopping=False, length_penalty=1.0)
        rows = [r[1:] for r in out.tolist()]  # after the start token
        return [r[:r.index(eos)] if eos in r else r for r in rows]
    return ember, reference


def timed(fn) -> tuple[float, object]:
    start = time.thread_time()
    with torch.no_grad():
        out = fn()
    return time.thread_time() - start, out


def race(family: str, shape: tuple, batches: tuple[int, ...], modes: tuple[str, ...], repeats: int) -> list[dict]:
    preset, vocab, length, new = shape
    ours, hf = build(family, preset, vocab)
    results = []
    for b, mode in cases(family, batches, modes):
        low = 5 if family != "gpt2" else 0  # T5 / BART: ids 0-2 are pad, </s>, <unk> or <s>
        inputs = torch.randint(low, vocab - 1, (b, length), generator=torch.Generator().manual_seed(b))
        if family != "gpt2":
            inputs[:, -1] = hf.config.eos_token_id  # an input ends with </s>
        ember, reference = runners(family, ours, hf, inputs, new, mode)
        times = {"ember": [], "transformers": []}
        equal = True
        for r in range(repeats + 1):  # the first pair warms up
            order = [("ember", ember), ("transformers", reference)][:: 1 if r % 2 == 0 else -1]
            got = {}
            for name, fn in order:
                t, got[name] = timed(fn)
                if r:
                    times[name].append(t)
            equal = equal and got["ember"] == got["transformers"]
        e, h = median(times["ember"]), median(times["transformers"])
        tokens = b * new
        row = {"family": family, "shape": preset, "vocab": vocab, "batch": b, "mode": mode, "input": length,
               "new_tokens": new, "ember_ms": 1e3 * e, "transformers_ms": 1e3 * h, "ember_tok_s": tokens / e,
               "transformers_tok_s": tokens / h, "speedup": h / e, "tokens_equal": equal}
        results.append(row)
        print(f"{family:4s} {preset:10s} batch {b} {mode:6s}: ember {1e3 * e:8.0f} ms {tokens / e:7.1f} tok/s | "
              f"transformers {1e3 * h:8.0f} ms {tokens / h:7.1f} tok/s | {h / e:.2f}x | "
              f"tokens {'equal' if equal else 'DIFFERENT'}", flush=True)
    return results


def make_serve_run(root: Path, preset: str, vocab: int, context: int) -> Path:
    """A GPT-2 run folder of ``preset``'s shape with a byte-level BPE of at most ``vocab`` words
    trained on a few sentences (serving needs a tokenizer; the weights are random)."""
    from ember.config import DataConfig, RunConfig
    from ember.runs.checkpoint import save_weights
    from ember.runs.folder import write_run_files
    from ember.tokenizers import train_tokenizer

    corpus = root / "corpus.txt"
    corpus.write_text("The river runs by the old town. The bank opened a new office in the spring.\n"
                      "A summary: the town is old, the film is long and the review is mixed.\n" * 50)
    tok = train_tokenizer([corpus], kind="bpe", vocab_size=vocab, lowercase=False, progress=False, fmt="text")
    tok.save(str(root / "tok.json"))
    torch.manual_seed(0)
    cfg = dataclasses.replace(model_preset(preset), vocab_size=tok.get_vocab_size(), max_position=context)
    model = CausalLM(build_backbone(cfg))
    run = root / "run"
    write_run_files(run, RunConfig(objective="clm", model=cfg, data=DataConfig(max_seq_length=context)),
                    root / "tok.json")
    save_weights(model.state_dict(), run / "model.safetensors")
    return run


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def serve_latency(preset: str, new: int, requests: int) -> dict:
    """Time-to-first-token and per-token latency through a real ``ember serve`` process."""
    import signal
    import socket
    import subprocess
    import tempfile

    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        run = make_serve_run(Path(tmp), preset, 8000, 128)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        root = Path(__file__).resolve().parents[2]
        proc = subprocess.Popen([sys.executable, "-m", "ember", "serve", str(run), "--port", str(port),
                                 "--threads", "1", "--max-new-tokens", str(new)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"ember serve exited: {proc.stdout.read()}")
                try:
                    httpx.get(f"{url}/healthz", timeout=1.0)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("ember serve did not start") from None
                    time.sleep(0.2)
            prompt = "The river runs by the old town and the bank opened"

            def latency(n: int) -> tuple[float, int]:
                """(seconds, tokens generated): a row may end early at end-of-text (random weights:
                rarely), so the per-token figure divides by what was generated."""
                start = time.perf_counter()
                got = httpx.post(f"{url}/generate", json={"prompt": prompt, "max_new_tokens": n}, timeout=300)
                elapsed = time.perf_counter() - start
                if got.status_code != 200:
                    raise RuntimeError(f"/generate answered {got.status_code}: {got.text}")
                return elapsed, got.json()["results"][0]["generated_tokens"]

            latency(new)  # warm-up
            first, full = [], []
            for _ in range(requests):  # alternated, so both see the same load
                first.append(latency(1)[0])
                full.append(latency(new))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    base = statistics.median(first)
    per_token = [(f - base) / max(n - 1, 1) for f, n in full]
    full = [f for f, _ in full]
    result = {"shape": preset, "new_tokens": new, "requests": requests,
              "ttft_ms_p50": 1e3 * percentile(first, 0.5), "ttft_ms_p99": 1e3 * percentile(first, 0.99),
              "per_token_ms_p50": 1e3 * percentile(per_token, 0.5),
              "per_token_ms_p99": 1e3 * percentile(per_token, 0.99),
              "request_ms_p50": 1e3 * percentile(full, 0.5)}
    print(f"ember serve /generate, {preset} shape, 1 thread, {requests} requests each: time to first token "
          f"p50 {result['ttft_ms_p50']:.0f} ms p99 {result['ttft_ms_p99']:.0f} ms; per token p50 "
          f"{result['per_token_ms_p50']:.1f} ms p99 {result['per_token_ms_p99']:.1f} ms ({new} tokens: "
          f"{result['request_ms_p50']:.0f} ms)", flush=True)
    return result


def generation_rows(quick: bool) -> list[dict]:
    """headline.py's rows (its contract: ``work``, ``ratio``, ``reference``, ``detail``): the issue's
    goal cases - batch-1 greedy decoding of every family and batched beam search of the
    encoder-decoders - at the full sizes (``quick``: the smoke sizes, one timed pair)."""
    shapes, repeats = (TINY, 1) if quick else (SHAPES, 3)
    rows = []
    for family, batches, modes in (("gpt2", (1,), ("greedy",)), ("t5", (1, 8), ("greedy", "beam4")),
                                   ("bart", (1, 8), ("greedy", "beam4"))):
        for r in race(family, shapes[family], batches, modes, repeats):
            if (r["batch"], r["mode"]) in ((1, "greedy"), (8, "beam4")):
                rows.append({"work": f"{family} ({r['shape']}) decoding, batch {r['batch']} {r['mode']}, "
                                     f"{r['input']} -> {r['new_tokens']} tokens",
                             "reference": "transformers generate, same weights", "ratio": r["speedup"],
                             "detail": f"{r['ember_tok_s']:.1f} vs {r['transformers_tok_s']:.1f} tok/s; tokens "
                                       f"{'equal' if r['tokens_equal'] else 'DIFFERENT'}"})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--modes", nargs="+", choices=("greedy", "sample", "beam4"), default=["greedy", "sample", "beam4"])
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per side (after one warm-up)")
    p.add_argument("--tiny", action="store_true", help="the smoke sizes (seconds)")
    p.add_argument("--serve", action="store_true", help="also time /generate through `ember serve` (GPT-2)")
    p.add_argument("--serve-requests", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{machine()}; {load()}; clock: CPU time of this thread", flush=True)
    shapes = TINY if args.tiny else SHAPES
    results = []
    for family in args.families:
        results += race(family, shapes[family], tuple(args.batches), tuple(args.modes), args.repeats)
    if args.serve:
        preset, _, _, new = shapes["gpt2"]
        results.append({"serve": serve_latency(preset, new, 3 if args.tiny else args.serve_requests)})
    print(load(), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
