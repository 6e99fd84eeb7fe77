"""Continued pre-training: ``ember pretrain --init RUN`` starts from a trained model, not random weights.

Longformer §5 (Beltagy et al. 2020) made RoBERTa long and then *continued* its MLM pre-training
on long documents, with a fresh optimizer and schedule (warm-up, then decay); DAPT (Gururangan
et al. 2020) continues a model on a new domain the same way, with the objective it was
pre-trained with. Here the run given to ``--init`` (an ember run, one of its checkpoints, or an
HF folder) fixes:

- the model: its config (family, sizes, attention variant, window, positions, ``sep_token_id``,
  XLNet's memory, XLM's languages) and all its weights, heads included when it has them (an MLM
  head, XLM's output bias, BART's ``final_logits_bias``, T5 v1.1's ``lm_head`` go on training; a
  model without one, like the sentence-transformers MiniLM, gets a fresh head);
- the tokenizer: the prepared shards must have been tokenized with it (checked here, before
  anything is written; ``ember prepare --tokenizer INIT/tokenizer.json``);
- the objective, through its family (``CONTINUATIONS``): each family continues with its own
  pre-training objective, from a recipe whose ``model`` section is ignored. Encoders continue
  with ``continue-mlm``; GPT, T5, BART/MASS, XLNet, XLM and Dai & Le's LSTM with their family's recipe
  (its objective and objective settings, data layout and optimizer, a fresh schedule). An init
  pre-trained with an objective the family has a recipe for continues with that one (a MASS run
  with ``mass-mini``, an SA-LSTM with ``sa-lstm``); an XLM's objective follows the data, as the xlm recipes say (TLM with
  MLM when the corpus has parallel pairs; CLM for a causal XLM). ``--recipe`` or ``--set
  objective=`` choose another; one that does not fit the family is refused.

A ``--set model.*`` may change only what leaves the weights' shapes and meaning alone (dropout:
``FREE_MODEL_SETTINGS``, as for fine-tuning; an XLNet's memory length too); anything else
contradicts the init and is refused. ``data.max_seq_length: 0`` means the init model's positions
(``max_position``: 4,096 for ``convert --long 4096``); a recipe's longer length is cut to them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ember.config import RunConfig
from ember.errors import EmberError


@dataclasses.dataclass(frozen=True)
class Continuation:
    """How one family continues pre-training."""

    recipes: dict[str, str]  # objective -> the recipe that continues it; the first is the family's default
    others: tuple[str, ...] = ()  # other objectives that fit (--recipe, --set objective=)
    # model settings besides FREE_MODEL_SETTINGS an init of the family may change: XLNet's memory is
    # context the layers attend to, not weights (Transformer-XL evaluates with a longer one than it
    # trained with, Dai et al. 2019 §4); an HF XLNet comes with none (mem_len None)
    free: tuple[str, ...] = ()

    @property
    def objectives(self) -> tuple[str, ...]:
        return tuple(self.recipes) + self.others


_MLM = Continuation({"mlm": "continue-mlm"}, ("bert", "albert", "spanbert"))
CONTINUATIONS = {
    **{family: _MLM for family in ("bert", "roberta", "albert", "electra", "distilbert")},
    "gpt": Continuation({"clm": "gpt1-mini"}),
    "gpt2": Continuation({"clm": "gpt2-mini"}),
    "t5": Continuation({"span_corruption": "t5-mini"}, ("prefix_lm", "bert_denoising", "mass_denoising",
                                                        "deshuffle", "replace_spans", "drop_tokens")),
    "bart": Continuation({"bart": "bart-mini", "mass": "mass-mini"}),
    "xlnet": Continuation({"plm": "xlnet-mini"}, free=("mem_len", "reuse_len")),
    "xlm": Continuation({"xlm_mlm": "xlm-mini"}, ("xlm_mlm_tlm", "tlm", "xlm_clm")),
    "lstm": Continuation({"lstm_lm": "lm-lstm", "seq_autoencoder": "sa-lstm"}),  # Dai & Le 2015
}


def continuation_recipe(family: str, objective: str = "") -> str:
    """The recipe a ``family`` run pre-trained with ``objective`` continues with by default."""
    recipes = CONTINUATIONS[family].recipes
    return recipes.get(objective) or next(iter(recipes.values()))


def continued_config(recipe, init: str | Path, overrides: list[str]) -> RunConfig:
    """The RunConfig of a run continuing ``init``: the recipe's training settings (``overrides``
    applied) around the init's model. Refuses what would contradict the init (module docstring)."""
    from ember.api.finetune import FREE_MODEL_SETTINGS, model_with_overrides
    from ember.config import apply_overrides, load_yaml, run_config_from_dict
    from ember.recipes import recipe_path
    from ember.runs.init import load_start

    if isinstance(recipe, RunConfig):
        raise EmberError("--init takes its model from the init run: pass a recipe name or YAML path, not a RunConfig")
    start = load_start(init)
    family = start.model.family
    if start.objective == "bilm":
        raise EmberError(f"--init {init} is an ELMo run: its char-CNN and LSTMs read raw text with their own word "
                         "vocabulary, which continued pre-training from shards does not do; pre-train ELMo anew")
    if family not in CONTINUATIONS:
        raise EmberError(f"--init {init}: continued pre-training is built for {', '.join(CONTINUATIONS)} "
                         f"models; this is a {family} run")
    plan = CONTINUATIONS[family]
    default = continuation_recipe(family, start.objective)
    base = recipe_path(recipe or default)
    values = load_yaml(base)
    values.pop("model", None)  # the recipe's architecture is for a run from scratch; the init's replaces it
    if recipe is None and start.objective in plan.recipes:
        values["objective"] = start.objective
    values = apply_overrides(values, [o for o in overrides if not o.startswith("model.")])
    cfg = run_config_from_dict(values, where=str(base))
    if cfg.kind != "pretrain":
        raise EmberError(f"{recipe} is a {cfg.kind} recipe, not a pre-training one")
    if family == "xlm" and recipe is None and not any(o.startswith("objective=") for o in overrides):
        cfg = dataclasses.replace(cfg, objective=xlm_objective(start.model, cfg.data.prepared))
    if cfg.objective not in plan.objectives:
        where = "--set objective" if any(o.startswith("objective=") for o in overrides) else base.name
        raise EmberError(f"--init {init} is a {family} model: objective {cfg.objective!r} (from {where}) does not "
                         f"fit it; a {family} model continues with {', '.join(plan.objectives)} (without --recipe: "
                         f"{default})")
    model = model_with_overrides(start.model, [o for o in overrides if o.startswith("model.")], pretrained=True,
                                 free=FREE_MODEL_SETTINGS + plan.free)
    length = cfg.data.max_seq_length or model.max_position
    if length > model.max_position and not any(o.startswith("data.max_seq_length=") for o in overrides):
        from ember.train.distributed import is_first_process

        if is_first_process():  # every rank builds its config; one says so
            print(f"data.max_seq_length {length} ({base.name}) -> {model.max_position}, the init's positions "
                  "(--set data.max_seq_length=N to choose)")
        length = model.max_position
    if cfg.data.prepared:
        check_corpus_tokenizer(cfg.data.prepared, start.tokenizer, init)
    return dataclasses.replace(cfg, model=model, init=str(init),
                               data=dataclasses.replace(cfg.data, max_seq_length=length))


def xlm_objective(model, prepared) -> str:
    """XLM's objective for its data, as the xlm recipes choose it (Lample & Conneau 2019 §3): CLM
    for a causal model; MLM on monolingual streams, TLM on parallel pairs, both mixed when the
    corpus has both (``ember prepare --lang ... --parallel ...``)."""
    from ember.data.multilingual import corpus_streams
    from ember.data.shards import TokenCorpus

    if model.causal:
        return "xlm_clm"
    if not prepared or not (Path(prepared) / "meta.json").is_file():
        return "xlm_mlm"  # the objective's setup says what the data lacks
    corpus = TokenCorpus(prepared, "train")
    if not corpus.meta.get("multilingual"):
        return "xlm_mlm"
    kinds = {s.kind for s in corpus_streams(corpus)[1] if len(s.docs)}
    return {frozenset({"parallel"}): "tlm", frozenset({"mono", "parallel"}): "xlm_mlm_tlm"}.get(frozenset(kinds),
                                                                                              "xlm_mlm")


def check_corpus_tokenizer(prepared: str | Path, tokenizer: Path, init) -> None:
    """Refuse shards tokenized with another tokenizer than the init's: their ids would index the
    wrong embedding rows. Same file (sha256) or the same rules and vocabulary (``_json``) pass."""
    from ember.data.shards import TokenCorpus
    from ember.fileio import sha256_file
    from ember.tokenizers import load_tokenizer

    if not (Path(prepared) / "meta.json").is_file():
        return  # not `ember prepare` shards: setup names what it expected
    corpus = TokenCorpus(prepared, "train")
    theirs = corpus.meta["tokenizer"].get("sha256") or sha256_file(corpus.tokenizer_path)
    ours = sha256_file(tokenizer)
    if theirs == ours:
        return
    fix = f"re-run `ember prepare ... --tokenizer {tokenizer}` for this model"
    size = load_tokenizer(tokenizer).get_vocab_size()
    if corpus.vocab_size != size:
        raise EmberError(f"--data {prepared} was tokenized with a {corpus.vocab_size:,}-token vocabulary, --init "
                         f"{init} uses {size:,} tokens; {fix}")
    if _json(corpus.tokenizer_path) != _json(tokenizer):
        raise EmberError(f"--data {prepared} was tokenized with another tokenizer (sha256 {theirs[:12]}) than --init "
                         f"{init}'s (sha256 {ours[:12]}), both {size:,} tokens; {fix}")


def _json(path: Path) -> dict:
    """tokenizer.json without its call-time settings (truncation, padding: `ember prepare` sets its
    own; an HF folder's often differ from its import's), i.e. what decides the ids."""
    with open(path, encoding="utf-8") as fh:
        return {k: v for k, v in json.load(fh).items() if k not in ("truncation", "padding")}


def check_resumed_init(saved: RunConfig, init: str | Path | None, out: Path) -> None:
    """A resumed run continues from its checkpoints, so its --init is only a check: it must be the
    one the run started from (or left out)."""
    if init is None:
        return
    if not saved.init:
        raise EmberError(f"--resume: {out} was pre-trained from random weights, not from --init {init}; "
                         "drop --init")
    if Path(saved.init).resolve() != Path(init).resolve():
        raise EmberError(f"--resume: {out} continues {saved.init}, not --init {init}; drop --init or give that one")
