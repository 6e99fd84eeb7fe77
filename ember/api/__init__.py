"""The library's public functions: the same runs as the verbs, from Python.

    pretrain(recipe, out, data=..., overrides=[...])          -> RunResult
    finetune(task, out, init=..., seeds=[...], lr=..., ...)   -> RunResult
    distill(method, teacher, out, student=..., ...)           -> RunResult
    evaluate(run, split="", file=None)                        -> {"task", "split", "metrics"}

Each takes what its verb takes (a recipe name or config plus ``section.key=value`` overrides)
and holds the checks and defaults the verb used to: `ember pretrain`, `ember finetune`,
`ember distill`, `ember evaluate`, `ember compare`, `ember glue` and the quickstart are thin
callers of these.
"""

from ember.api.distill import distill
from ember.api.evaluate import evaluate
from ember.api.finetune import finetune
from ember.api.pretrain import pretrain
from ember.api.results import RunResult

__all__ = ["RunResult", "distill", "evaluate", "finetune", "pretrain"]
