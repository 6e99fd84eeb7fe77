"""The library's public functions: the same runs as the verbs, from Python.

    pretrain(recipe, out, data=..., overrides=[...])          -> RunResult
    finetune(task, out, init=..., seeds=[...], lr=..., ...)   -> RunResult
    distill(method, teacher, out, student=..., ...)           -> RunResult
    evaluate(run, split="", file=None, data=None)             -> {"task", "split", "metrics"}
    evaluate(run, task="stsb", zero_shot=True)                -> cosine similarity vs gold (x100)
    predict(run, input_file, out=None)                        -> one dict per input row (as `ember predict`)
    load(path, backend="torch")                               -> Model (classify, embed, ...)
    embed(run, texts, pooling=..., normalize=...)             -> (N, H) float32 numpy array
    embed_file(run, input, out)                               -> writes out.npy, returns a summary

Each takes what its verb takes (a recipe name or config plus ``section.key=value`` overrides)
and holds the checks and defaults the verb used to: `ember pretrain`, `ember finetune`,
`ember distill`, `ember evaluate`, `ember predict`, `ember compare`, `ember glue` and the quickstart are thin
callers of these.
"""

from ember.api.distill import distill
from ember.api.embed import embed, embed_file
from ember.api.evaluate import evaluate
from ember.api.finetune import finetune
from ember.api.model import Model, load
from ember.api.predict import predict
from ember.api.pretrain import pretrain
from ember.api.results import RunResult

__all__ = ["Model", "RunResult", "distill", "embed", "embed_file", "evaluate", "finetune", "load", "predict",
           "pretrain"]
