"""Configuration: frozen dataclasses, named presets, YAML load/save and dotted overrides.

A run is described by three parts: ``model`` (the backbone's shape), ``data`` (corpus and
sequence construction) and ``train`` (optimisation and budgets). Recipes in ``recipes/``
are YAML files with those three sections; ``--set train.lr=1e-4`` overrides any field.
The model's shape lives in ``ember.model_config`` and the named presets in ``ember.presets``;
both are re-exported here, where every caller has always found them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ember.errors import EmberError
from ember.model_config import (ATTN_TYPES, DECODER_FAMILIES, ENCODER_FAMILIES, LSTM_POOLINGS,  # noqa: F401
                                SEQ2SEQ_FAMILIES, SHARE_MODES, ModelConfig)
from ember.presets import MODEL_PRESETS, model_preset  # noqa: F401


@dataclass(frozen=True)
class DataConfig:
    """Where pre-training data comes from and how sequences are built."""

    prepared: str = ""  # folder written by `ember prepare`
    max_seq_length: int = 128
    short_seq_prob: float = 0.1  # BERT: 10% of sequences get a shorter random target length
    mask_prob: float = 0.15
    max_predictions: int = 20  # BERT's max_predictions_per_seq for length 128
    nsp: bool = True
    eval_examples: int = 512  # held-out sequences scored at each evaluation
    # Which units are masked together (ember.objectives.masking): "token" (BERT),
    # "whole_word" (all pieces of a word), "phrase" (ERNIE: corpus/phrase-detector spans
    # stored by `ember prepare`, else whole words), "span" (SpanBERT geometric spans).
    masking: str = "token"
    span_p: float = 0.2  # SpanBERT: span length in words ~ Geometric(p), clipped at max_span
    max_span: int = 10
    # How sequences are packed: "segments" (BERT chunks split into A/B for NSP/SOP, or one
    # segment without), "full_sentences" (RoBERTa: contiguous sentences, may cross
    # documents, separated by [SEP]) or "doc_sentences" (RoBERTa: never cross a document).
    packing: str = "segments"
    static_masks: int = 0  # 0 = dynamic masking; N = each sequence has N fixed masks (RoBERTa §4.1)


@dataclass(frozen=True)
class ElectraConfig:
    """ELECTRA's generator/discriminator settings (Clark et al. 2020, §3.2 and App. C)."""

    generator_size: float = 0.25  # generator hidden size (and heads, FFN) as a fraction of the discriminator's
    generator_layers: float = 1.0  # fraction of the discriminator's layers
    discriminator_weight: float = 50.0  # lambda in L = L_MLM + lambda * L_Disc
    temperature: float = 1.0  # sampling temperature for the replacements


@dataclass(frozen=True)
class ElmoConfig:
    """ELMo's biLM and its word-level data (Peters et al. 2018, §3.1 and §3.4; char-CNN and
    highway after Kim et al. 2016 / Jozefowicz et al. 2016). Used when ``objective: bilm``;
    ``data.prepared`` then names raw text (files, folders or globs), read word by word."""

    # token representation: char CNN -> highway -> projection (shared by both directions)
    char_dim: int = 16
    filters: str = "1:32,2:32,3:64,4:128"  # width:count per convolution; counts summed = CNN width
    highway_layers: int = 1
    max_word_chars: int = 50  # characters per word including the begin/end-of-word markers
    projection_dim: int = 128  # token representation size = LSTM projection size
    # biLSTM LM (paper: 2 layers of 4096 cells projected to 512, residual between layers)
    num_layers: int = 2
    hidden_size: int = 256  # LSTM cells per layer and direction
    dropout: float = 0.1
    # word vocabulary of the shared softmax: the corpus's most frequent words + <unk> <s> </s>
    vocab_size: int = 20000
    lowercase: bool = False  # the paper's model is cased; lower-case when the task text is
    max_corpus_words: int = 0  # stop reading the corpus after this many words (0 = all)
    valid_every: int = 50  # every N-th document is held out for perplexity


@dataclass(frozen=True)
class DenoisingConfig:
    """T5's unsupervised objectives (Raffel et al. 2020, §3.1.4 and §3.3; ember.objectives.
    span_corruption): the encoder's input length is ``data.max_seq_length`` (T5: 512)."""

    noise_density: float = 0.15  # share of tokens corrupted (§3.3.3: 10/15/25/50% compared)
    mean_noise_span_length: float = 3.0  # span_corruption: mean span length (§3.3.4: 2/3/5/10)
    random_token_prob: float = 0.1  # bert_denoising: corrupted tokens given a random token, not the mask


@dataclass(frozen=True)
class NoisingConfig:
    """BART's noising (objective ``bart``; Lewis et al. 2020, §2.2 and §5.1; ember.objectives.
    bart_noising) and MASS's fragment (objective ``mass``; Song et al. 2019, §2.2). The encoder's
    input is at most ``data.max_seq_length`` tokens (BART: 512 for Base/Large, 1024 positions)."""

    # applied in fairseq's order, permute -> one of mask/delete/infill -> rotate; §5.1's final
    # model: text infilling (30% of tokens, Poisson(3) spans) + permutation of all sentences
    kinds: str = "infill,permute"  # comma-separated: mask, delete, infill, permute, rotate
    mask_ratio: float = 0.3  # share of tokens masked / deleted / in infilled spans
    poisson_lambda: float = 3.0  # infill: span lengths ~ Poisson(lambda); 0-length spans insert a mask
    unit: str = "token"  # what is counted, masked and spanned: "token" or "word" (fairseq's whole words)
    random_ratio: float = 0.0  # share of masks that are a random token instead (fairseq --mask-random)
    permute_ratio: float = 1.0  # share of a block's sentences that change places
    rotate_ratio: float = 1.0  # probability that a block is rotated, when "rotate" is asked for
    mass_ratio: float = 0.5  # MASS: the masked fragment's share of the sequence (k = 50% of m, §4.1)
    # MASS: of the fragment's encoder tokens, this share becomes [M], this share a random token of
    # the vocabulary, the rest stays unchanged (BERT's 80/10/10, which MASS keeps; Song et al. 2019)
    mass_mask_prob: float = 0.8
    mass_random_prob: float = 0.1


@dataclass(frozen=True)
class PlmConfig:
    """XLNet's permutation language model (objective ``plm``; Yang et al. 2019 §2.3, App. A and
    the released data pipeline). Sequences are ``A <sep> B <sep> <cls>`` of data.max_seq_length
    tokens, each with the model.mem_len tokens before it as Transformer-XL memory."""

    k: float = 6.0  # partial prediction: about 1/K of the tokens, the last 1/K of the order, are targets
    num_predict: int = 0  # targets per sequence; 0 = round(max_seq_length / k) (512 / 6 -> 85)
    max_span: int = 5  # a predicted span covers n <= max_span whole words, P(n) proportional to 1/n
    random_segment_prob: float = 0.5  # B comes from a random place in the corpus, not after A


@dataclass(frozen=True)
class XlmConfig:
    """XLM's data mix (Lample & Conneau 2019, §3.1 and §3.3), for objectives xlm_mlm,
    xlm_clm, tlm and xlm_mlm_tlm on a corpus prepared with language codes."""

    alpha: float = 0.5  # q_i = p_i^alpha / sum_j p_j^alpha: languages sampled with this exponent
    tlm_fraction: float = 0.5  # xlm_mlm_tlm: share of sequences that are TLM pairs (the rest MLM streams)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, budgets, logging and checkpointing."""

    seed: int = 0
    lr: float = 5e-4
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    batch_size: int = 32  # sequences per optimizer step, over all ranks and accumulation
    grad_accum: int = 1
    # Batches of examples of similar length (ember.train.length_groups; transformers'
    # group_by_length), so little of each batch is padding, with examples of one text (a SQuAD
    # paragraph's windows) at most one per batch where the pool allows (issue 46). "auto": where
    # it was measured to cost no accuracy (task distillation with KD / PKD); fine-tuning heads stay
    # shuffled (short grouped runs scored lower: SST-2 -0.43 dev points over 8 seeds; QA's windows
    # could not be shown as accurate; BENCHMARKS.md). "true": every head whose loss is one term per
    # example (classification, regression, pairs, QA); "false": never. Per-token losses (tagging, text-to-text, TinyBERT's layers)
    # and pre-training blocks (all of one length) are always shuffled.
    group_by_length: str = "auto"
    max_grad_norm: float = 1.0
    max_steps: int = 10000
    max_time: float = 0.0  # seconds of training-step time on `clock`; 0 = no limit
    # Which clock max_time and the logged `elapsed` use: "wall" (time.perf_counter) or "cpu"
    # (this process's CPU time, time.process_time). "cpu" makes time budgets mean the same
    # compute on a shared, busy machine; with one thread (num_threads=1) it counts no
    # spin-waiting, so it measures work done.
    clock: str = "wall"
    warmup_steps: int = 0
    warmup_ratio: float = 0.01  # used when warmup_steps is 0
    # linear warm-up then linear decay to 0 at max_steps; "constant"; "stlr" (ULMFiT);
    # "time": the same warm-up/decay laid over the time budget max_time (cramming-style)
    schedule: str = "linear"
    stlr_cut_frac: float = 0.1  # STLR: fraction of steps with increasing lr (Howard & Ruder 2018, eq. 3)
    stlr_ratio: float = 32.0  # STLR: how much smaller the lowest lr is than the peak
    # The last share of max_steps trained with every dropout off (BART, Lewis et al. 2020 §5.1:
    # "we disable dropout for the final 10% of training steps"); 0 = never
    dropout_off_fraction: float = 0.0
    eval_every: int = 500
    save_every: int = 500
    log_every: int = 10
    keep_checkpoints: int = 2
    device: str = "cpu"
    dtype: str = "float32"  # "bfloat16" turns on autocast where the device supports it
    num_threads: int = 0  # 0: torch default
    # On the CPU, keep freed memory in the process so each step's large tensors reuse the last
    # step's pages instead of faulting in fresh ones (ember.host_memory; ~20% of a
    # bert-mini step on one core). The process keeps its peak footprint until it exits.
    keep_host_memory: bool = True
    # torch.compile the training forward/backward (inductor). Off by default: on a 2-core CPU
    # it gained ~3% at bert-mini (within noise) for ~1 min of compilation (BENCHMARKS.md).
    compile: bool = False
    # Optimizer (ember.train.optim): "adamw" (BERT and most recipes) or "adafactor" (Shazeer &
    # Stern 2018, as T5 pre-trains: Raffel et al. 2020, §3.1.2). T5's schedule is
    # schedule=inverse_sqrt with lr 0.01 and warmup_steps 10000: 1/sqrt(max(step, 10^4)).
    optimizer: str = "adamw"
    # Adafactor (Shazeer & Stern 2018, Alg. 4/5): second-moment decay beta2_t = 1 - t^-decay_rate
    # (§7.1, increasing decay; T5 0.8), update clipping threshold d (§6; 1.0), step size scaled by
    # the parameter's RMS ("relative step size"; on in T5), beta1 0 = no momentum (as T5).
    adafactor_decay_rate: float = 0.8
    adafactor_clip_threshold: float = 1.0
    adafactor_scale_parameter: bool = True
    adafactor_beta1: float = 0.0
    # Beyond one machine (docs/distributed.md). Under torchrun: "ddp" replicates the model on
    # every rank; "fsdp" shards parameters, gradients and optimizer state (FSDP2, one unit per
    # transformer block) and writes sharded checkpoints (torch.distributed.checkpoint).
    parallel: str = "ddp"
    # Sequences per forward pass on one rank; when set, grad_accum is derived as
    # batch_size / (micro_batch_size x world size), so the global batch and the micro-batch
    # layout (hence the losses) stay the same whatever the number of ranks. 0: use grad_accum.
    micro_batch_size: int = 0
    # On a CPU, when neither micro_batch_size nor grad_accum is set and the loss is one term per
    # example (fine-tuning classification, regression, QA; task distillation), each step's batch
    # runs as the fewest equal micro-batches of at most this many tokens (sequences x the longest
    # example): the same gradient, a fraction of the memory. Measured with MiniLM on SQuAD windows
    # (BENCHMARKS.md): 48 x 384 tokens peak at 18.4 GB whole, 5.4 GB in 12s, at the same speed.
    # 0 turns it off.
    micro_batch_tokens: int = 4608
    # optimizer "lamb" (You et al. 2019, Alg. 2) uses adam_beta1/adam_beta2/adam_eps and
    # weight_decay; lr scaling for a grown batch: lr x (batch_size / lr_base_batch) ("linear",
    # Goyal et al. 2017) or its square root ("sqrt"); "none" (or lr_base_batch 0) keeps lr.
    lr_scaling: str = "none"
    lr_base_batch: int = 0
    # Where metrics also go besides metrics.jsonl (ember.train.tracking), comma-separated:
    # "tensorboard" (RUN/tb), "mlflow" (params, per-step metrics, the run folder's files and final
    # model in an MLflow store: tracking_uri, else MLFLOW_TRACKING_URI, else ./mlflow.db), "wandb"
    # (config, per-step and final metrics in a Weights & Biases run, offline); "" = none.
    trackers: str = "tensorboard"
    tracking_uri: str = ""
    experiment: str = ""  # the MLflow experiment's name; "" = "ember"
    # "wandb" (ember.train.wandb_run): an offline W&B run in wandb_dir ("" = the run folder), which
    # `wandb sync` uploads later; nothing reaches the network unless wandb_mode is "online".
    wandb_project: str = ""  # "" = "ember"
    wandb_name: str = ""  # "" = the run folder's name
    wandb_group: str = ""  # "" = none, or in `ember sweep` the sweep's name
    wandb_dir: str = ""
    wandb_mode: str = "offline"

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_by_length", length_grouping(self.group_by_length))
        # fp16 autocast without loss scaling lets small gradients underflow to zero (Micikevicius
        # et al. 2018, §3.2), silently; ember does not scale losses, so it refuses fp16 outright.
        if self.dtype.lower() in ("float16", "fp16", "half"):
            raise EmberError(f"train.dtype={self.dtype}: fp16 training needs loss scaling, which ember does "
                             "not do, so small gradients would underflow to zero; use train.dtype=bfloat16 "
                             "(fp32's range, autocast on GPUs that support it) or float32")


@dataclass(frozen=True)
class TaskConfig:
    """Fine-tuning: which task, how inputs are cut, where the weights start from."""

    name: str = ""
    max_length: int = 128
    init: str = ""  # a pre-training run folder, an HF checkpoint folder, or "random"
    epochs: float = 3.0
    eval_batch_size: int = 64
    train_split: str = "train"  # SNLI here has only dev/test: train on dev, evaluate on test
    eval_split: str = "dev"
    # Feature-based transfer (ELMo, Peters et al. 2018): the encoder is frozen; a learned
    # ScalarMix over its num_layers+1 hidden states, ``feature_layers`` per-token GELU layers
    # and the task head are trained (ember.train.transfer).
    features: bool = False
    feature_layers: int = 1
    # which hidden states: the learned mix, or a fixed choice (BERT Table 7; ember.tasks.families.feature_transfer)
    feature_combine: str = "mix"
    # ULMFiT (Howard & Ruder 2018) options, usable with every encoder and task:
    layer_lr_decay: float = 1.0  # lr x decay^(depth below the head) per layer; 1 = off; ULMFiT 1/2.6
    gradual_unfreeze: bool = False  # epoch 1: head + top layer; one more layer per epoch
    patience: int = 0  # stop after N dev evaluations without a better main metric; 0 = never
    # The language of the task's texts ("" = the task's own: "en" for GLUE, "ko" NSMC, "ru"
    # RuSentiment); a model with language embeddings (XLM) gives every token this language's id.
    language: str = ""
    # How a text-to-text (T5) run decodes its outputs at evaluation, `ember predict` and the
    # task's served method: 1 = greedy (T5's choice for most tasks); beam search with a length
    # penalty for long outputs (Raffel et al. 2020, §3.7: 4 beams, penalty 0.6 for WMT and CNN/DM).
    num_beams: int = 1
    length_penalty: float = 1.0
    # the most tokens decoded per output; 0 = the task's own budget (its longest label + 1; your
    # own targets: twice the longest one fine-tuning read; at most model.max_position)
    max_new_tokens: int = 0
    # A BART run fine-tunes sentence (pair) classification, regression and SQuAD with the paper's heads
    # on the decoder's final states (Lewis et al. 2020 §3.1-3.2, ember.tasks.families.bart); true: text
    # to text on T5's adapters instead (a T5 run always is; text2text files always are)
    text2text: bool = False
    # How a text-to-text run writes each task as text (ember.tasks.text2text.templates): "t5", T5's
    # task prefixes (Raffel et al. 2020, Appendix D), or "decanlp", every task as a question over a
    # context (McCann et al. 2018; ember.tasks.text2text.decanlp). Encoder runs take only "t5".
    templates: str = "t5"
    # Multi-task training (ember.train.multitask, docs/multitask.md): the tasks sharing one encoder,
    # comma-separated ("" = one task, ``name``), and how each step's task is drawn (T5, Raffel et al.
    # 2020, §3.5.2): "proportional" to the training set sizes capped at ``mixing_limit`` (K; the
    # default, T5's largest, caps nothing here), "temperature" (those rates ^ 1/``mixing_temperature``,
    # renormalised) or "equal".
    tasks: str = ""
    mixing: str = "proportional"
    mixing_limit: int = 2 ** 21
    mixing_temperature: float = 1.0


@dataclass(frozen=True)
class KnowledgeConfig:
    """Knowledge graphs in an encoder (ember.knowledge, docs/knowledge.md): K-BERT's injected
    triples (Liu et al. 2020) and ERNIE's entity fusion (Zhang et al. 2019), alone or together,
    for fine-tuning any encoder family; ERNIE's dEA objective for continued pre-training."""

    graph: str = ""  # K-BERT: triples file (head<TAB>relation<TAB>tail) injected into each sentence; "" = off
    relations: str = ""  # keep only these relations of the graph (comma-separated); "" = all
    max_triples: int = 2  # k: triples injected per entity (the released K-BERT code's max_entities)
    entities: str = ""  # ERNIE: entity embeddings folder (`ember kg embed`, or OpenKE's files); "" = off
    fusion_layers: int = 0  # top encoder layers given an information fusion layer; 0 = the top half (ERNIE 6 of 12)
    entity_heads: int = 4  # heads of the entity self-attention (ERNIE: 4 over 100 dimensions)
    num_entities: int = 0  # rows of the entity table: set from the embeddings when a run starts
    entity_dim: int = 0  # width of the entity table: likewise
    # Objective "ernie" (`ember pretrain --recipe ernie-dea`): MLM + denoising entity auto-encoder
    # (§4.2) on raw text, continuing from a pre-trained encoder.
    init: str = ""  # the run or HF checkpoint folder pre-training continues from
    max_sentences: int = 100000  # training sentences (with an entity) read from data.prepared; 0 = all
    mlm_weight: float = 1.0  # loss = mlm_weight * MLM + dea_weight * dEA (0 drops MLM)
    dea_weight: float = 1.0


@dataclass(frozen=True)
class RunConfig:
    """Everything a run is: one section per part (``RUN/config.yaml`` holds them all; a recipe
    sets some, ``section.key=value`` overrides any field)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    kind: str = "pretrain"  # "pretrain" or "finetune": what the run folder holds
    objective: str = "bert"  # which pre-training objective (see ember.objectives)
    # Pre-training: the run, checkpoint or HF folder whose model it continues ('' = random weights;
    # `ember pretrain --init`, ember.api.continued). The model section is then the init's.
    init: str = ""
    electra: ElectraConfig = field(default_factory=ElectraConfig)
    elmo: ElmoConfig = field(default_factory=ElmoConfig)
    denoising: DenoisingConfig = field(default_factory=DenoisingConfig)  # T5 objectives
    noising: NoisingConfig = field(default_factory=NoisingConfig)  # BART and MASS objectives
    plm: PlmConfig = field(default_factory=PlmConfig)
    xlm: XlmConfig = field(default_factory=XlmConfig)
    task: TaskConfig = field(default_factory=lambda: TaskConfig())
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)  # K-BERT / ERNIE (ember.knowledge)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _build(cls: type, values: dict, where: str) -> Any:
    """Build dataclass ``cls`` from a dict, checking names and coercing types."""
    if not isinstance(values, dict):
        raise EmberError(f"{where}: expected a mapping of settings, got {values!r}")
    defaults = cls()
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise EmberError(f"{where}: unknown setting(s) {sorted(unknown)}; valid: {sorted(names)}")
    kwargs = {}
    for name, value in values.items():
        default = getattr(defaults, name)
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value or {}, f"{where}.{name}")
        else:
            kwargs[name] = _coerce(value, default, f"{where}.{name}")
    return cls(**kwargs)


GROUPING_CHOICES = ("auto", "true", "false")
# the words a boolean setting takes on the command line or in YAML, as their canonical word
BOOL_WORDS = {"1": "true", "true": "true", "yes": "true", "on": "true",
              "0": "false", "false": "false", "no": "false", "off": "false"}


def length_grouping(value: Any) -> str:
    """``train.group_by_length`` as one of GROUPING_CHOICES; YAML's booleans (a run config saved
    when the setting was a bool, ``--set train.group_by_length=false``) mean "true" / "false"."""
    text = str(value).strip().lower()
    text = BOOL_WORDS.get(text, text)
    if text not in GROUPING_CHOICES:
        raise EmberError(f"train.group_by_length={value!r}; choose auto (group where it costs no accuracy: "
                         "task distillation), true (every head whose loss is one term per example) or false")
    return text


def _coerce(value: Any, default: Any, where: str) -> Any:
    """Coerce YAML / command-line values to the type of the field's default."""
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() not in BOOL_WORDS:
                raise EmberError(f"{where}: expected true/false, got {value!r}")
            return BOOL_WORDS[value.lower()] == "true"
        return bool(value)
    try:
        if isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(float(value)) if isinstance(value, str) else int(value)
        if isinstance(default, float):
            return float(value)
    except (TypeError, ValueError):
        raise EmberError(
            f"{where}: expected a {type(default).__name__}, got {value!r}"
        ) from None
    if isinstance(default, str):  # `--set train.trackers=` is YAML's null: the empty string, not "None"
        return "" if value is None else str(value)
    return value


def run_config_from_dict(values: dict, where: str = "config") -> RunConfig:
    """Build a RunConfig; ``model.preset: bert-mini`` starts the model from a named preset."""
    values = dict(values)
    model = dict(values.get("model") or {})
    preset = model.pop("preset", None)
    if preset is not None:
        model = {**dataclasses.asdict(model_preset(preset)), **model}
    values["model"] = model
    return _build(RunConfig, values, where)


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            values = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise EmberError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise EmberError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise EmberError(f"{path}: expected a mapping of settings at the top level")
    return values


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML scalars)."""
    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    for item in overrides:
        if "=" not in item:
            raise EmberError(f"override {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = values
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise EmberError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return values


def save_yaml(cfg: Any, path: str | Path) -> None:
    from ember.fileio import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))

