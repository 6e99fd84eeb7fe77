"""Zero-, one- and few-shot classification with a causal LM, as GPT-2 and GPT-3 evaluate.

For each evaluation example, k demonstrations are drawn at random from the training split
(GPT-3, Brown et al. 2020, §2.4: "randomly drawing K examples from that task's training set
as conditioning", here seeded by (seed, example index)). Each is written in the task's
prompt format with its answer; the query follows in the same format without one. Every label
has a verbalizer (SST-2 " negative"/" positive"; RTE " True"/" False" as GPT-3's Fig. G.31
format), and the label whose verbalizer tokens get the highest summed log-likelihood
log P(verbalizer | context) is the prediction. Demonstrations that do not fit the context
(``max_length`` tokens) are dropped, oldest first; the report says how many shots were used.

Accuracy is reported per k as the mean and spread (standard deviation, min, max) over seeds;
k = 0 has no draw and is scored once.

Contextual calibration (``calibrate=True``; Zhao et al. 2021, "Calibrate Before Use", §5):
small LMs tend to favour one label whatever the input, from the prompt's wording and the
demonstrations' order and labels. For every context, the same demonstrations are followed by
content-free queries ("N/A", "[MASK]" and the empty string, the paper's three); their label
probabilities, normalised over the labels and averaged, estimate that bias p_cf, and the
calibrated prediction is argmax_y p(y | x) / p_cf(y) (the paper's W = diag(p_cf)^-1, b = 0).
Both the raw and the calibrated accuracy are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ember.errors import EmberError
from ember.tasks.readers.glue import Example, get_task, read_examples


@dataclass(frozen=True)
class PromptFormat:
    """How one example is written: ``prompt`` (with {a} / {b}) then the label's verbalizer."""

    prompt: str
    verbalizers: tuple[str, ...]  # aligned with the task's label ids 0..n-1
    demo_split: str = "train"
    eval_split: str = "dev"
    separator: str = "\n\n"  # between demonstrations (GPT-3's choice)


FORMATS = {
    "sst2": PromptFormat("Review: {a}\nSentiment:", (" negative", " positive")),
    # GPT-3 (Fig. G.31): "<premise>\nquestion: <hypothesis> True or False?\nanswer: True"
    "rte": PromptFormat("{a}\nquestion: {b} True or False?\nanswer:", (" True", " False")),
    "cola": PromptFormat("{a}\nQuestion: Is this sentence grammatical?\nAnswer:", (" No", " Yes")),
    "mrpc": PromptFormat("{a}\nQuestion: Does this mean the same as \"{b}\"?\nAnswer:", (" No", " Yes")),
    "qnli": PromptFormat("{a}\n{b}\nQuestion: Does the sentence answer the question?\nAnswer:", (" Yes", " No"),
                         demo_split="dev"),  # only dev exists here: demos never include the query
    # SNLI stands in for MNLI/ANLI; GPT-3's ANLI format: True / Neither / False.
    "snli": PromptFormat("{a}\nquestion: {b} True, False, or Neither?\nanswer:", (" True", " Neither", " False"),
                         demo_split="dev", eval_split="test"),
}


def prompt_format(task: str) -> PromptFormat:
    spec = get_task(task)
    if spec.name not in FORMATS:
        raise EmberError(f"no few-shot prompt format for {spec.display_name}; have: "
                         f"{', '.join(get_task(t).display_name for t in FORMATS)}")
    return FORMATS[spec.name]


def render(fmt: PromptFormat, ex: Example, with_answer: bool) -> str:
    text = fmt.prompt.format(a=ex.text_a, b=ex.text_b or "")
    return text + fmt.verbalizers[int(ex.label)] if with_answer else text


def draw_demonstrations(pool: list[Example], k: int, seed: int, index: int,
                        exclude: str | None = None) -> list[Example]:
    """k distinct examples of ``pool``, drawn by (seed, index); never the query itself."""
    if k == 0:
        return []
    rng = np.random.default_rng([seed, index, 7919])
    picks = []
    for i in rng.permutation(len(pool)):
        if pool[i].guid != exclude:
            picks.append(pool[i])
            if len(picks) == k:
                break
    return picks


CONTENT_FREE = ("N/A", "[MASK]", "")  # Zhao et al. 2021, §5


def content_free_queries(query: Example) -> list[Example]:
    """The query with its text(s) replaced by each content-free string (both texts for pairs)."""
    return [Example(query.guid, cf, None if query.text_b is None else cf, query.label) for cf in CONTENT_FREE]


def calibrate_scores(scores: torch.Tensor, content_free_scores: list[torch.Tensor]) -> torch.Tensor:
    """Calibrated log-scores log p(y|x) - log p_cf(y), with p_cf the mean over the content-free
    inputs of the label distribution (softmax over labels of each (N, L) score matrix)."""
    p_cf = torch.stack([s.log_softmax(-1).exp() for s in content_free_scores]).mean(0)
    return scores.log_softmax(-1) - p_cf.log()


def build_context(tokenizer, fmt: PromptFormat, demos: list[Example], query: Example,
                  room: int) -> tuple[list[int], int]:
    """Token ids of demonstrations + query prompt in at most ``room`` tokens, and the number
    of demonstrations kept (the oldest are dropped first; a query alone that is too long
    keeps its end, where the question is)."""
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    query_text = render(fmt, query, with_answer=False)
    shown = [render(fmt, d, with_answer=True) + fmt.separator for d in demos]

    def context(start: int) -> list[int]:
        # One string, encoded once, so the query's tokens are those it has after a separator.
        return encode("".join(shown[start:]) + query_text)

    alone = context(len(demos))
    if len(alone) > room:
        return alone[-room:], 0
    # The fewest dropped: binary search over how many of the oldest to drop (dropping more never
    # makes the context longer), log2(k) encodings; one per k made --shots 256 take seconds per
    # example and --shots 100000 never finish.
    lo, hi = 0, len(demos)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(context(mid)) <= room:
            hi = mid
        else:
            lo = mid + 1
    return context(lo), len(demos) - lo


def score_continuations(model, contexts: list[list[int]], continuations: list[list[int]],
                        batch_size: int = 16) -> torch.Tensor:
    """Summed log P(continuation | context) for each candidate.

    ``contexts[i]`` pairs with every ``continuations[j]``: returns (N, L). Rows are
    context + continuation, scored in length-sorted batches of ``batch_size`` sequences
    (``ember.tasks.inference.scoring.causal_logprobs``, the same code as the ``score`` method).
    """
    from ember.tasks.inference.scoring import causal_logprobs

    rows = [(c + cont, len(cont)) for c in contexts for cont in continuations]
    logps = causal_logprobs(model, rows, batch_size)
    sums = [sum(lp.tolist()) for lp in logps]  # float64 accumulation of the float32 terms
    return torch.tensor(sums, dtype=torch.float64).view(len(contexts), len(continuations))


def _summary(k: int, values: list[tuple[float, float, np.ndarray]], seeds: list[int]) -> dict:
    accs = [a for a, _, _ in values]
    return {
        "k": k, "mean": float(np.mean(accs)), "std": float(np.std(accs)) if len(accs) > 1 else 0.0,
        "min": min(accs), "max": max(accs), "per_seed": accs, "seeds": seeds,
        "mean_shots_used": float(np.mean([u for _, u, _ in values])),
        # How often each label is predicted: a model that always says one label scores the
        # majority rate (or its complement), which is what an untrained LM tends to do.
        "predicted_label_rate": np.mean([r for _, _, r in values], axis=0).round(4).tolist(),
    }


def evaluate_fewshot(model, tokenizer, task: str, shots: list[int], seeds: list[int],
                     max_length: int, limit: int | None = None, batch_size: int = 16,
                     progress: bool = False, data_root=None, calibrate: bool = False) -> dict:
    """Accuracy for every k in ``shots``: {"k=K": {"mean", "std", "min", "max", "per_seed",
    "mean_shots_used", "predicted_label_rate"}, "majority": ..., "examples": N}; with
    ``calibrate`` also "k=K calibrated" in the same form (contextual calibration)."""
    for name, values in (("shots", shots), ("seeds", seeds)):
        if not values or len(set(values)) != len(values):
            raise EmberError(f"{name} {list(values)} must be distinct values, e.g. 1,2,3 (a repeat would be "
                             "counted twice in the summary)")
    spec = get_task(task)
    fmt = prompt_format(spec.name)
    evaluation = read_examples(spec, fmt.eval_split, data_root=data_root, limit=limit)
    pool = read_examples(spec, fmt.demo_split, data_root=data_root)
    conts = [tokenizer.encode(v, add_special_tokens=False).ids for v in fmt.verbalizers]
    room = max_length - max(len(c) for c in conts)
    if room < 8:
        raise EmberError(f"max_length={max_length} leaves no room for a prompt")
    labels = torch.tensor([int(e.label) for e in evaluation])
    majority = float(labels.bincount().max()) / len(labels)
    report = {"task": spec.display_name, "examples": len(evaluation), "majority": majority,
              "verbalizers": list(fmt.verbalizers), "max_length": max_length}
    runs = [(k, s) for k in shots for s in (seeds if k > 0 else seeds[:1])]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(runs), unit="run", desc=f"few-shot {spec.display_name}")
    results: dict[tuple[int, str], list[tuple[float, float, np.ndarray]]] = {}  # (k, "" | " calibrated")
    for k, seed in runs:
        contexts, used, free = [], [], [[] for _ in CONTENT_FREE]
        for i, ex in enumerate(evaluation):
            demos = draw_demonstrations(pool, k, seed, i, exclude=ex.guid if fmt.demo_split == fmt.eval_split else None)
            ids, n = build_context(tokenizer, fmt, demos, ex, room)
            contexts.append(ids)
            used.append(n)
            if calibrate:  # the same demonstrations (as many as fit), then a content-free query
                for c, cf in enumerate(content_free_queries(ex)):
                    free[c].append(build_context(tokenizer, fmt, demos[len(demos) - n:], cf, room)[0])
        scores = score_continuations(model, contexts, conts, batch_size)
        variants = {"": scores}
        if calibrate:
            variants[" calibrated"] = calibrate_scores(
                scores, [score_continuations(model, f, conts, batch_size) for f in free])
        for variant, s in variants.items():
            predicted = s.argmax(-1)
            accuracy = float((predicted == labels).float().mean())
            rates = np.bincount(predicted.numpy(), minlength=len(conts)) / len(evaluation)
            results.setdefault((k, variant), []).append((accuracy, float(np.mean(used)), rates))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(k=k, seed=seed, acc=f"{results[k, ''][-1][0]:.3f}")
    if bar is not None:
        bar.close()
    for (k, variant), values in results.items():
        report[f"k={k}{variant}"] = _summary(k, values, seeds if k > 0 else seeds[:1])
    return report


def format_report(report: dict) -> str:
    lines = [f"{report['task']}: {report['examples']} examples, majority class {report['majority']:.3f}, "
             f"verbalizers {report['verbalizers']}, context {report['max_length']} tokens"]
    for key, r in report.items():
        if key.startswith("k="):
            if r["k"] == 0:
                spread = " (no demonstrations to draw: one run)"
            else:
                spread = f" ± {r['std']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}, {len(r['per_seed'])} seeds)"
            shots = "" if r["k"] == 0 else f", {r['mean_shots_used']:.2f} shots fit on average"
            rates = ", ".join(f"{v.strip()} {p:.2f}" for v, p in zip(report["verbalizers"], r["predicted_label_rate"]))
            lines.append(f"  {key}: accuracy {r['mean']:.3f}{spread}{shots}; predicted: {rates}")
    return "\n".join(lines)


__all__ = ["CONTENT_FREE", "FORMATS", "PromptFormat", "build_context", "calibrate_scores",
           "content_free_queries", "draw_demonstrations", "evaluate_fewshot", "format_report",
           "score_continuations"]
