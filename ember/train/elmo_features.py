"""`ember elmo-features`: a task model over frozen ELMo features vs. static embeddings only.

The biLM of an ELMo run (``ember pretrain --recipe elmo-mini``) is loaded and frozen; its
L+1 layers are computed once per sentence (they never change), then a small BiLSTM
classifier with a per-task ScalarMix is trained on [x_k; ELMo_k] (ember.tasks.families.elmo).
``use_elmo=False`` trains the same classifier on x_k alone - the baseline. The run folder
holds settings.json, task_words.json (the static-embedding vocabulary), model.safetensors
(best on dev), checkpoints for --resume, metrics.jsonl and results.json (best dev metrics,
the learned layer weights s_j and gamma).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ember.config import TrainConfig
from ember.data.in_memory import InMemoryData
from ember.errors import EmberError
from ember.fileio import atomic_write_text
from ember.tasks.families.elmo import UNK, ElmoClassifier, task_vocabulary
from ember.runs.checkpoint import save_weights
from ember.train.loop import Trainer, epoch_schedule
from ember.train.checks import check_train_settings
from ember.runs.folder import check_run_dir, prepare_run_dir


def _words(texts: list, vocab) -> list[list[str]]:
    """Strings are tokenized (ember.tokenizers.words); word lists (CoNLL) are kept as split.
    Either way words are normalized as the ELMo run's vocabulary is (lower-casing)."""
    from ember.tokenizers.words import tokenize_words

    norm = vocab.normalize if vocab is not None else (lambda w: w)
    return [[norm(w) for w in (tokenize_words(t) if isinstance(t, str) else t)] for t in texts]


def _read_task(task: str, train_limit: int | None):
    """(name, train inputs, train labels, dev inputs, dev labels, label names, tagging)."""
    from ember.tasks.readers.glue import get_task, read_examples

    if task.lower().replace("-", "").replace("_", "") in ("conll2003", "conll", "ner"):
        from ember.tasks.readers.conll import LABELS, read_split

        index = {t: i for i, t in enumerate(LABELS)}
        train, dev = read_split("train", limit=train_limit), read_split("dev")
        return ("conll2003", [list(s.words) for s in train], [[index[t] for t in s.tags] for s in train],
                [list(s.words) for s in dev], [[index[t] for t in s.tags] for s in dev], LABELS, True)
    spec = get_task(task)
    if spec.is_pair or spec.is_regression:
        raise EmberError(f"elmo-features trains a single-sentence classifier or a tagger; "
                         f"{spec.display_name} is a sentence-pair or regression task (use sst2, cola "
                         "or conll2003)")
    train, dev = read_examples(spec, "train", limit=train_limit), read_examples(spec, "dev")
    return (spec.name, [e.text_a for e in train], [e.label for e in train], [e.text_a for e in dev],
            [e.label for e in dev], list(spec.label_names or range(spec.num_labels)), False)


def _featurize(texts: list, labels, word_index, bilm, vocab, progress: bool, name: str) -> list[dict]:
    from ember.models.elmo import sentence_layers

    words = _words(texts, vocab)
    unk = word_index[UNK]
    items = [{"word_ids": np.array([word_index.get(w, unk) for w in ws], dtype=np.int64), "label": y}
             for ws, y in zip(words, labels)]
    if bilm is not None:
        chunk = 512
        starts = range(0, len(words), chunk)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc=f"ELMo features ({name})", unit="x512 sentences")
        layers = []
        for s in starts:  # stored as float16: the biLM is frozen, the features are just inputs
            layers += sentence_layers(bilm, vocab, words[s : s + chunk], batch_size=64, dtype=torch.float16)
        for item, h in zip(items, layers):
            item["elmo"] = h  # (n, L+1, 2P)
    return items


def score_on(module: ElmoClassifier, items: list[dict], batch_size: int, device: str,
             label_names=None) -> dict:
    """Classification: accuracy. Tagging: entity-level P/R/F1 (CoNLL) and token accuracy."""
    module.eval()
    preds = []
    with torch.no_grad():
        for s in range(0, len(items), batch_size):
            batch = {k: v.to(device) for k, v in module.make_batch(items[s : s + batch_size]).items()}
            predicted = module.logits(batch).argmax(-1).cpu()
            if module.tagging:
                preds += [p[: len(item["label"])].tolist() for p, item in zip(predicted, items[s : s + batch_size])]
            else:
                preds += predicted.tolist()
    if not module.tagging:
        return {"accuracy": float(np.mean([p == item["label"] for p, item in zip(preds, items)]))}
    from ember.tasks.metrics.ner import entity_scores

    gold = [[label_names[t] for t in item["label"]] for item in items]
    pred = [[label_names[t] for t in p] for p in preds]
    tokens = sum(len(g) for g in gold)
    correct = sum(a == b for g, p in zip(gold, pred) for a, b in zip(g, p))
    return {**entity_scores(gold, pred), "token_accuracy": correct / max(1, tokens)}


def run_elmo_features(task: str, run_dir: Path, elmo_run: str | None, use_elmo: bool = True,
                      train_limit: int | None = None, epochs: float = 3.0, batch_size: int = 32,
                      lr: float = 1e-3, seed: int = 0, max_time: float = 0.0, embedding_dim: int = 100,
                      hidden_size: int = 128, dropout: float = 0.5, device: str = "cpu",
                      resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    if use_elmo and not elmo_run:
        raise EmberError("pass --elmo RUN (an `ember pretrain --recipe elmo-mini` run folder), "
                         "or --no-elmo for the static-embedding baseline")
    run_dir = Path(run_dir)
    check_run_dir(run_dir, resume, overwrite, inputs=(elmo_run,))  # before minutes of feature extraction, not after
    name, train_x, train_y, dev_x, dev_y, label_names, tagging = _read_task(task, train_limit)
    settings = {"task": name, "elmo": str(elmo_run or ""), "use_elmo": use_elmo,
                "train_limit": train_limit, "epochs": epochs, "batch_size": batch_size, "lr": lr,
                "seed": seed, "embedding_dim": embedding_dim, "hidden_size": hidden_size,
                "dropout": dropout}
    saved = run_dir / "settings.json"
    if resume and saved.is_file():
        old = json.loads(saved.read_text())
        changed = sorted(k for k in settings if old.get(k) != settings[k])
        if changed:
            raise EmberError(f"--resume continues {run_dir} with its saved settings, but this command "
                             f"changes {changed}; drop those options or start a new run")
    bilm = vocab = None
    if use_elmo:
        from ember.models.elmo import load_elmo

        bilm, vocab = load_elmo(elmo_run, device)  # vocab also fixes the tokenization (case)
        for p in bilm.parameters():
            p.requires_grad_(False)
    elif elmo_run:  # the baseline tokenizes as the ELMo run does, but needs no weights
        from ember.tokenizers.words import WordVocab

        vocab = WordVocab.load(Path(elmo_run) / "words.json")
    word_index = task_vocabulary(_words(train_x, vocab))
    train_items = _featurize(train_x, train_y, word_index, bilm, vocab, progress, "train")
    dev_items = _featurize(dev_x, dev_y, word_index, bilm, vocab, progress, "dev")

    train_cfg, _ = epoch_schedule(TrainConfig(
        seed=seed, lr=lr, weight_decay=0.0, adam_eps=1e-8, batch_size=batch_size, max_time=max_time,
        warmup_steps=0, warmup_ratio=0.0, schedule="constant", max_grad_norm=5.0, eval_every=0, save_every=0,
        log_every=20, device=device), len(train_items), epochs)
    torch.manual_seed(seed)
    n_layers = len(bilm.forward_lm.layers) + 1 if bilm is not None else 0
    module = ElmoClassifier(len(word_index), len(label_names), embedding_dim, hidden_size,
                            elmo_layers=n_layers, elmo_dim=bilm.output_size if bilm is not None else 0,
                            dropout=dropout, tagging=tagging)
    main_metric = "f1" if tagging else "accuracy"
    check_train_settings(train_cfg, "elmo-features")
    prepare_run_dir(run_dir, resume, overwrite, inputs=(elmo_run,))
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(saved, json.dumps(settings, indent=2))
    atomic_write_text(run_dir / "task_words.json", json.dumps(list(word_index)))

    def evaluate(m):
        return score_on(m, dev_items, 128, device, label_names)

    def on_best(m, metrics):
        save_weights(m.state_dict(), run_dir / "model.safetensors", {"kind": "elmo-features"})

    trainer = Trainer(module, InMemoryData(train_items), train_cfg, run_dir, evaluate=evaluate,
                      best_metric=main_metric, on_best=on_best, progress=progress)
    params = sum(p.numel() for p in module.parameters())
    print(f"{name}: {len(train_items):,} train / {len(dev_items):,} dev sentences, "
          f"{'[x_k; ELMo_k]' if bilm is not None else 'static x_k only'}, task model {params / 1e6:.2f}M "
          f"parameters, {train_cfg.max_steps} steps")
    result = trainer.train(resume=resume)
    summary = {"task": name, "use_elmo": bilm is not None, "elmo": settings["elmo"],
               "train_examples": len(train_items), "dev_examples": len(dev_items),
               "metric": main_metric, "best_dev": trainer.best["value"], "best_step": trainer.best["step"],
               "steps": result["step"], "train_seconds": round(result["elapsed"], 1)}
    if module.scalar_mix is not None:
        summary["layer_weights"] = [round(float(w), 4) for w in module.scalar_mix.layer_weights().detach()]
        summary["gamma"] = round(module.scalar_mix.gamma.item(), 4)
    atomic_write_text(run_dir / "results.json", json.dumps(summary, indent=2))
    return summary


