"""Make a trained encoder long: ``ember convert --long N`` (docs/long.md).

Longformer §5 ("Pretraining and Finetuning", Beltagy et al. 2020) continues from RoBERTa
rather than training from scratch: the 512 learned position embeddings are copied over and
over to fill the longer table (row i of the new table is row i mod 512 of the old: "copying
the 512 position embeddings multiple times", which kept the local structure each attention
head had learned), the global projections start as copies of the local query/key/value ones,
and the attention becomes Longformer's sliding window. Any encoder family works (BERT,
RoBERTa, ELECTRA, ALBERT, DistilBERT, XLM, the imported MiniLM): the family's own weights and
names do not change, only the position table grows and three projections per layer appear.

With a window as wide as the input (w/2 >= length - 1) and no global positions the long model
computes what the original did; narrower windows are the point (and need some training to
recover the original's accuracy, §5 Table 5).

Reformer (``attention="reformer"``, Kitaev et al. 2020) shares one projection between queries and
keys: it starts as the trained query projection (the value and output projections are kept, the
key projection is dropped). Keys become the normalised queries, so unlike a wide Longformer
window this changes the function at every length: the long model needs continued training
(the paper trains shared-QK models from scratch, §2 "Shared-QK Transformer", finding them as good).
Reversible layers are not made from a trained post-LN encoder (their residuals differ).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from ember.config import ModelConfig, RunConfig
from ember.errors import EmberError

_QKV = re.compile(r"(.*\.attention)\.qkv\.(weight|bias)")


def lengthen(cfg: ModelConfig, state: dict[str, torch.Tensor], length: int, window: int | str = 512,
             global_first: int | None = None, attention: str = "longformer", block: int = 64,
             random_blocks: int = 3, chunk: int = 64, hashes: int = 2,
             buckets: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state) of the long model; ``state`` in ember's names (``backbone.*`` and heads).
    ``attention="bigbird"`` (Zaheer et al. 2020) instead: ``block`` tokens per block and
    ``random_blocks`` random blocks per query block; BigBird adds no weights, so only the
    position table grows (BigBird's own checkpoints were warm-started from RoBERTa's the same way,
    §4 "we warm start from RoBERTa's checkpoint"). ``attention="reformer"``: LSH attention with
    ``chunk``, ``hashes`` rounds and ``buckets`` (0: about 2 T / chunk), see the module docstring."""
    old = cfg.max_position
    if length < old:
        raise EmberError(f"--long {length} is shorter than the model's {old} positions; give at least {old}")
    if attention not in ("longformer", "bigbird", "reformer"):
        raise EmberError(f"--attention {attention}: choose longformer, bigbird or reformer")
    options = {"longformer": {"attention_window": str(window),
                              "attention_global": cfg.attention_global if global_first is None else global_first},
               "bigbird": {"attention_block": block, "attention_random_blocks": random_blocks},
               "reformer": {"attention_chunk": chunk, "attention_hashes": hashes, "attention_buckets": buckets}}[attention]
    try:
        long_cfg = dataclasses.replace(cfg, attention=attention, max_position=length, **options)
    except EmberError as exc:  # the attention's own checks (family, window), named as the command's
        raise EmberError(f"cannot make this {cfg.family} model long: {exc}") from None
    out = dict(state)
    for key, table in state.items():
        if key.endswith("embeddings.position.weight"):
            if cfg.sinusoidal_positions:  # a fixed table: its longer version, not copies
                from ember.nn.embeddings import sinusoidal_table

                out[key] = sinusoidal_table(length, table.shape[1]).to(table.dtype)
            else:  # Longformer §5: row i is the trained row i mod old
                out[key] = table[torch.arange(length) % old].clone()
        match = _QKV.fullmatch(key)
        if attention == "reformer" and match:  # shared QK from the trained queries; the keys' projection goes
            query, _, value = table.chunk(3, dim=0)
            del out[key]
            out[f"{match[1]}.query_key.{match[2]}"], out[f"{match[1]}.value.{match[2]}"] = query.clone(), value.clone()
        if attention == "longformer" and match and f"{match[1]}.query_global.{match[2]}" not in state:  # §5: copies of the local ones
            for name, part in zip(("query_global", "key_global", "value_global"), table.chunk(3, dim=0)):
                out[f"{match[1]}.{name}.{match[2]}"] = part.clone()
    if not any(k.endswith("embeddings.position.weight") for k in state):
        raise EmberError("these weights have no position table (embeddings.position.weight) to extend")
    return long_cfg, out


def lengthen_run(run_dir: Path, out_dir: Path, length: int, **options) -> None:
    """Write the long version (``options``: ``lengthen``'s) of the run folder ``run_dir`` to ``out_dir``: config.yaml, the
    weights and the files a run is used with (tokenizer, labels, embedding defaults, a custom task's record). Optimizer
    state and checkpoints stay behind (their shapes no longer fit)."""
    import shutil

    from ember.runs.checkpoint import load_weights, save_weights
    from ember.runs.folder import load_run_config, write_run_files

    cfg: RunConfig = load_run_config(run_dir)
    model, state = lengthen(cfg.model, load_weights(run_dir / "model.safetensors"), length, **options)
    model = dataclasses.replace(model, sep_token_id=_separator(run_dir / "tokenizer.json", model.sep_token_id))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_run_files(out_dir, dataclasses.replace(cfg, model=model), run_dir / "tokenizer.json")
    save_weights(state, out_dir / "model.safetensors", {"lengthened_from": str(run_dir), "long": str(length)})
    for name in ("labels.json", "embedding.json", "task.json"):  # task.json: a run of your own files
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, out_dir / name)


def _separator(tokenizer_path: Path, known: int) -> int:
    """The tokenizer's separator id ([SEP] / </s>), which a long model's QA head reads to put the
    question under global attention (ember.tasks.qa.head); ``known`` when the tokenizer has none."""
    from ember.tokenizers import load_tokenizer, special_token_ids

    try:
        return special_token_ids(load_tokenizer(tokenizer_path)).get("sep", known)
    except EmberError:  # a vocabulary without the BERT/RoBERTa roles: nothing to record
        return known
