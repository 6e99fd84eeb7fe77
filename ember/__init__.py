"""ember: pre-train, fine-tune, evaluate, distil and serve BERT-era language models.

    import ember
    run = ember.pretrain("bert-mini", "runs/bert-mini", data="runs/wiki", overrides=["train.max_time=600"])
    result = ember.finetune("sst2", "runs/sst2", init=run.run_dir, lr=1e-4)
    print(result.metrics["accuracy"])
    model = ember.load(result.run_dir)
    model.classify(["a gripping film", "a dull mess"])
    vectors = ember.embed("runs/minilm", ["a fine film", "a dull mess"])  # (2, H) numpy array
    best = ember.sweep("finetune", "runs/rte-sweep", grid="bert-paper", task="rte", init="runs/minilm")

The functions are imported on first use (``import ember`` stays light, and ``ember --help`` fast).
"""

__version__ = "0.1.0"

_API = {"pretrain", "finetune", "distill", "evaluate", "predict", "load", "Model", "embed", "embed_file", "RunResult", "sweep"}
__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name == "sweep":  # an experiment over the functions below (ember.experiments), not one of them
        from ember.experiments.sweep_run import sweep

        return sweep
    if name in _API:
        import ember.api

        return getattr(ember.api, name)
    raise AttributeError(f"module 'ember' has no attribute {name!r}; its API: {', '.join(sorted(_API))}")


def __dir__() -> list[str]:
    """The lazily imported functions too, so a notebook's tab completion offers ``ember.load``."""
    return sorted(set(globals()) | _API)
