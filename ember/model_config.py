"""The backbone's shape: ``ModelConfig`` and the family names it is checked against.

Kept apart from ``ember.config`` (runs: data, training, tasks, YAML) so that the named presets
(``ember.presets``) can build ModelConfigs while ``ember.config`` resolves ``model.preset``
through them, without a circular import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import EmberError

SHARE_MODES = ("none", "all", "attention", "ffn")
# Every family below is the same Encoder with different options; the family name decides
# how checkpoints are named when exchanged with Hugging Face (ember.interop).
ENCODER_FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert", "xlm")
# Causal decoders (ember.models.decoder): GPT-1 ("gpt") and GPT-2 ("gpt2").
DECODER_FAMILIES = ("gpt", "gpt2")
# Encoder-decoders (ember.models.encoder_decoder): T5 v1.0 and v1.1 ("t5"); BART and mBART
# ("bart"; MASS, Song et al. 2019, is an objective on the same backbone).
SEQ2SEQ_FAMILIES = ("t5", "bart")
POSITION_KINDS = ("relative", "learned")  # encoder-decoder positions: T5's bias buckets | BART's table
NORM_KINDS = ("rms", "layer")  # encoder-decoder norms: T5's scale-only | LayerNorm with a bias (BART)
INIT_SCHEMES = ("mesh_tf", "normal")  # T5's fan-in scaled init | N(0, initializer_range) (BART, BERT)
ATTN_TYPES = ("bi", "uni")  # XLNet's attention: bidirectional (XLNet) or causal (Transformer-XL)
LSTM_POOLINGS = ("last", "linear_gain")  # the LSTM classifier's read-out (Dai & Le 2015, §2-3)
# The encoder's attention (docs/long.md): "full" (every pair), "longformer" (sliding window +
# global positions, Beltagy et al. 2020; ember.nn.longformer), "bigbird" (block-sparse: window,
# global and random blocks, Zaheer et al. 2020; ember.nn.bigbird), "performer" (FAVOR+ random
# features, Choromanski et al. 2021; ember.nn.performer), "reformer" (LSH buckets, Kitaev et al.
# 2020; ember.nn.lsh).
ATTENTION_KINDS = ("full", "longformer", "bigbird", "performer", "reformer")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the backbone: a Transformer encoder (BERT, Devlin et al. 2019, Table/§3 and App. A)
    by default; ``family`` and the family options below make it a decoder (GPT), an
    encoder-decoder (T5), XLNet, XLM or an LSTM."""

    family: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position: int = 512
    type_vocab_size: int = 2  # 0: no segment embeddings (RoBERTa/DistilBERT style)
    hidden_act: str = "gelu"  # exact erf GELU, as the original TF BERT
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    pre_layer_norm: bool = False  # BERT is post-LN; GPT-2 style pre-LN is an option
    pooler: bool = True  # [CLS] dense+tanh pooler used by NSP and classification
    embedding_size: int = 0  # E; 0 = hidden_size. E < H factorizes embeddings (ALBERT, ELECTRA)
    share_layers: str = "none"  # ALBERT cross-layer sharing: none | all | attention | ffn
    # T5 (Raffel et al. 2020; family "t5"). num_layers is the encoder's depth, hidden_act
    # "relu" (v1.0) or "gated-gelu_new" (v1.1's gated-GELU), layer_norm_eps T5's 1e-6;
    # max_position is the length trained on (relative positions set no hard limit).
    num_decoder_layers: int = 0  # 0 = as many as the encoder
    head_dim: int = 0  # d_kv, per-head size; 0 = hidden_size / num_heads
    relative_attention_num_buckets: int = 32  # §2.1: 32 log-spaced buckets ...
    relative_attention_max_distance: int = 128  # ... up to an offset of 128
    # v1.0: the LM head is the input embedding matrix, applied to h * d_model^-0.5; False: an
    # own lm_head (v1.1, "no parameter sharing between embedding and classifier layer")
    tie_word_embeddings: bool = True
    # Encoder-decoder options (ember.models.encoder_decoder); the defaults are T5's, BART's values
    # (Lewis et al. 2020, §2.1: "the standard sequence-to-sequence Transformer ... ReLU activation
    # functions to GeLUs"; the released fairseq/transformers models) in brackets. pre_layer_norm
    # chooses the block (T5 and mBART pre-LN with a final norm per stack, BART post-LN).
    position_kind: str = "relative"  # "relative" bias buckets | ["learned"] absolute table, 2 offset rows
    norm_kind: str = "rms"  # "rms" scale-only | ["layer"] LayerNorm with a bias, eps layer_norm_eps
    linear_bias: bool = False  # [True] biases on the attention and feed-forward projections
    embedding_norm: bool = False  # [True] LayerNorm on token + position embeddings (layernorm_embedding)
    scale_embedding: bool = False  # token embeddings times sqrt(hidden_size) (BART config option; mBART: True)
    final_logits_bias: bool = False  # [True] a (1, V) bias added to the LM logits (a buffer, as released)
    scale_decoder_outputs: bool = True  # a tied LM head reads h * d^-0.5 (T5 v1.0) | [False] h as is
    init_scheme: str = "mesh_tf"  # T5's fan-in init (logit scale folded into q) | ["normal"] N(0, std)
    decoder_start_token_id: int = -1  # first decoder input; -1 = pad_token_id (T5) | [2] BART's </s>
    # XLNet / Transformer-XL (family "xlnet", ember.models.xlnet; Yang et al. 2019, Dai et al.
    # 2019 §3.2-3.3). Other families ignore these. max_position is the segment length trained on.
    mem_len: int = 0  # hidden states per layer kept as memory for the next segment; 0 = none
    reuse_len: int = 0  # only a segment's first reuse_len positions enter the memory; 0 = all
    clamp_len: int = -1  # relative distances clipped to +-clamp_len; -1 = never
    bi_data: bool = False  # 2nd half of each batch reads with mirrored relative positions
    attn_type: str = "bi"  # "bi" (XLNet) or "uni" (causal, Transformer-XL)
    # XLM (Lample & Conneau 2019, §3.4 and Fig. 2): a learned language embedding added to
    # the token and position embeddings, a table of num_languages rows (0 = none);
    # ``languages`` names them in id order ("en,ru": en = 0, ru = 1), as HF's id2lang.
    num_languages: int = 0
    languages: str = ""
    sinusoidal_positions: bool = False  # fixed sin/cos position table (XLM's option) instead of learned
    causal: bool = False  # every position attends only to itself and the left (XLM's CLM, §3.1)
    # LSTM (family "lstm", ember.models.lstm; Dai & Le 2015 "Semi-supervised Sequence Learning"):
    # embedding_size is the word-embedding width (0 = hidden_size), hidden_size the LSTM cells per
    # layer, dropout the dropout between LSTM layers and on the top layer's outputs; max_position
    # only bounds the input length (an LSTM has no position table). Other families ignore these.
    embedding_dropout: float = 0.0  # dropout on the word embeddings (Dai & Le §4: embedding dropout)
    # How the LSTM classifier reads the label off the states (ember.tasks.families.lstm): "last"
    # (the final state, §2) or "linear_gain" (a prediction at every step, weighted t/T, §3)
    lstm_pooling: str = "last"
    # Long inputs (docs/long.md): the encoder families' attention variant. Longformer (Beltagy et
    # al. 2020, §3): ``attention_window`` is w', even (w'/2 keys each side), one value for every
    # layer or a comma list with one per layer ("32,32,64,64"); ``attention_dilation`` likewise
    # (1 = none); ``attention_global``: the first N positions attend globally when the caller
    # passes no global_attention_mask (1 = [CLS] / <s>, the paper's classification setting, §4).
    attention: str = "full"
    attention_window: str = "512"
    attention_dilation: str = "1"
    attention_global: int = 0
    # The separator's id (transformers' ``sep_token_id``; -1 = not recorded). Extractive QA on a
    # Longformer reads it: every position before a row's first separator - the question - attends
    # globally (Beltagy et al. 2020, §4; transformers' LongformerForQuestionAnswering).
    sep_token_id: int = -1
    # BigBird (Zaheer et al. 2020, App. D; ITC): tokens per block and random blocks per query block
    attention_block: int = 64
    attention_random_blocks: int = 3
    # Performer (Choromanski et al. 2021, FAVOR+): random features per head (m; the paper's 256)
    attention_features: int = 256
    # Reformer (Kitaev et al. 2020, §2): LSH buckets (even; 0 = about 2 T / chunk, a power of two,
    # as the paper and transformers), hash rounds, and the chunk of sorted tokens each query reads
    # (with the chunk before it); transformers' num_buckets, num_hashes, lsh_attn_chunk_length
    attention_buckets: int = 0
    attention_hashes: int = 2
    attention_chunk: int = 64
    # Reversible residual layers (RevNet, Kitaev et al. 2020 §3; ember.nn.reversible) for any
    # encoder attention: activations recomputed in the backward, so memory does not grow with
    # depth; pre-LN blocks only. ``ffn_chunk``: positions the feed-forward runs at a time there
    # (0 = all)
    reversible: bool = False
    ffn_chunk: int = 0

    def __post_init__(self) -> None:
        if self.share_layers not in SHARE_MODES:
            raise EmberError(f"model.share_layers={self.share_layers!r}; choose one of {', '.join(SHARE_MODES)}")
        if self.head_dim < 0 or self.num_decoder_layers < 0:
            raise EmberError(f"model.head_dim={self.head_dim} and model.num_decoder_layers="
                             f"{self.num_decoder_layers} must be >= 0 (0 = derived from the encoder)")
        if self.attn_type not in ATTN_TYPES:
            raise EmberError(f"model.attn_type={self.attn_type!r}; choose one of {', '.join(ATTN_TYPES)}")
        if self.mem_len < 0 or self.reuse_len < 0:
            raise EmberError(f"model.mem_len={self.mem_len} and model.reuse_len={self.reuse_len} must be "
                             ">= 0 (0: no memory / every position reused)")
        if self.hidden_size % self.num_heads and not self.head_dim:
            raise EmberError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_heads={self.num_heads}; pick sizes where hidden_size/num_heads is whole "
                "(or set model.head_dim, T5's d_kv)"
            )
        if self.num_languages == 1 or self.num_languages < 0:
            raise EmberError(f"model.num_languages={self.num_languages}: use 0 (no language embeddings) "
                             "or the number of languages (at least 2); one language needs no embedding")
        codes = self.language_codes
        if codes and len(codes) != self.num_languages:
            raise EmberError(f"model.languages={self.languages!r} names {len(codes)} languages but "
                             f"model.num_languages={self.num_languages}; give one code per language id")
        if len(set(codes)) != len(codes):
            raise EmberError(f"model.languages={self.languages!r} repeats a language code")
        for name, value, kinds in (("position_kind", self.position_kind, POSITION_KINDS),
                                   ("norm_kind", self.norm_kind, NORM_KINDS),
                                   ("init_scheme", self.init_scheme, INIT_SCHEMES)):
            if value not in kinds:
                raise EmberError(f"model.{name}={value!r}; choose one of {', '.join(kinds)}")
        if self.lstm_pooling not in LSTM_POOLINGS:
            raise EmberError(f"model.lstm_pooling={self.lstm_pooling!r}; choose one of {', '.join(LSTM_POOLINGS)}")
        if not 0.0 <= self.embedding_dropout < 1.0:
            raise EmberError(f"model.embedding_dropout={self.embedding_dropout} must be in [0, 1)")
        self._check_attention()

    def _check_attention(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise EmberError(f"model.attention={self.attention!r}; choose one of {', '.join(ATTENTION_KINDS)}")
        if self.reversible:
            self._check_reversible()
        if self.attention == "full":
            return
        if self.family not in ENCODER_FAMILIES or (self.causal and self.attention != "performer"):
            what = "a causal encoder" if self.causal else f"family {self.family!r}"
            raise EmberError(f"model.attention={self.attention} serves the bidirectional encoder families "
                             f"({', '.join(ENCODER_FAMILIES)}), not {what} (its memory, relative bias or "
                             "causal mask has no sparse form here; Performer's prefix sums serve a causal "
                             "encoder); use model.attention=full")
        if self.attention == "performer":
            if self.attention_features < 1:
                raise EmberError(f"model.attention_features={self.attention_features} must be >= 1")
            return
        if self.attention == "reformer":
            if self.attention_buckets < 0 or self.attention_buckets % 2:
                raise EmberError(f"model.attention_buckets={self.attention_buckets}: Reformer's LSH needs an even "
                                 "number of buckets (argmax over [xR; -xR]: two per rotation column), or 0 for "
                                 "about 2 T / chunk")
            if self.attention_hashes < 1 or self.attention_chunk < 1:
                raise EmberError(f"model.attention_hashes={self.attention_hashes} and model.attention_chunk="
                                 f"{self.attention_chunk} must be >= 1")
            if self.attention_global:
                raise EmberError("model.attention_global is Longformer's; Reformer's tokens find each other by "
                                 "hashing")
            return
        if self.attention == "bigbird":
            if self.attention_block < 1 or self.attention_random_blocks < 0:
                raise EmberError(f"model.attention_block={self.attention_block} must be >= 1 and "
                                 f"model.attention_random_blocks={self.attention_random_blocks} >= 0")
            if self.attention_global:
                raise EmberError("model.attention_global is Longformer's; BigBird's global tokens are its first "
                                 "and last blocks")
            return
        windows, dilations = self.attention_windows, self.attention_dilations
        if any(w <= 0 or w % 2 for w in windows):
            raise EmberError(f"model.attention_window={self.attention_window!r}: Longformer's window must be "
                             "a positive even number per layer (w/2 keys on each side of a token)")
        if self.share_layers in ("all", "attention") and len(set(zip(windows, dilations))) > 1:
            raise EmberError(f"model.share_layers={self.share_layers} shares one attention sub-layer across "
                             "layers, so it has one window and dilation; give one value each")
        if any(d < 1 for d in dilations):
            raise EmberError(f"model.attention_dilation={self.attention_dilation!r} must be >= 1 per layer")
        if self.attention_global < 0:
            raise EmberError(f"model.attention_global={self.attention_global} must be >= 0")

    def _check_reversible(self) -> None:
        if self.family not in ENCODER_FAMILIES or self.causal:
            what = "a causal encoder" if self.causal else f"family {self.family!r}"
            raise EmberError(f"model.reversible=true serves the bidirectional encoder families "
                             f"({', '.join(ENCODER_FAMILIES)}), not {what}; set model.reversible=false")
        if not self.pre_layer_norm:
            raise EmberError("model.reversible=true runs pre-LN blocks (Y1 = X1 + Attn(LN(X2)); a norm after "
                             "the residual cannot be inverted); set model.pre_layer_norm=true")
        if self.ffn_chunk < 0:
            raise EmberError(f"model.ffn_chunk={self.ffn_chunk} must be >= 0 (0 = every position at once)")

    def _per_layer(self, name: str) -> tuple[int, ...]:
        raw = str(getattr(self, name))
        try:
            values = tuple(int(v) for v in raw.split(",") if v.strip())
        except ValueError:
            raise EmberError(f"model.{name}={raw!r}: give whole numbers, one or one per layer "
                             "separated by commas") from None
        if len(values) == 1:
            return values * self.num_layers
        if len(values) != self.num_layers:
            raise EmberError(f"model.{name}={raw!r} gives {len(values)} values for {self.num_layers} layers; "
                             "give one value, or one per layer")
        return values

    @property
    def attention_windows(self) -> tuple[int, ...]:
        """Longformer's window w' of each layer (``attention_window`` read per layer)."""
        return self._per_layer("attention_window")

    @property
    def attention_dilations(self) -> tuple[int, ...]:
        return self._per_layer("attention_dilation")

    @property
    def language_codes(self) -> list[str]:
        """``languages`` as a list, index = language id ([] when unnamed)."""
        return [c.strip() for c in self.languages.split(",") if c.strip()]

    def language_id(self, code: str) -> int:
        """The language id of ``code`` for this model (XLM): its index in ``languages``."""
        codes = self.language_codes
        if code not in codes:
            raise EmberError(f"language {code!r} is not one of this model's languages "
                             f"({', '.join(codes) or 'none: model.languages is empty'}); "
                             "give one of those codes")
        return codes.index(code)

    @property
    def decoder_start_id(self) -> int:
        """The encoder-decoder's first decoder input: T5's pad id or BART's </s> (HF's
        ``decoder_start_token_id``)."""
        return self.pad_token_id if self.decoder_start_token_id < 0 else self.decoder_start_token_id
