"""ELECTRA pre-training: replaced-token detection (Clark et al. 2020, §2-3).

A small masked-LM *generator* G fills the masked positions of x with samples
x̂_t ~ p_G(x_t | x_masked); the *discriminator* D (the model that is kept) reads the
corrupted sequence and predicts, for every token, whether it is original or replaced:

    L = L_MLM(x, θ_G) + λ · L_Disc(x, θ_D),  λ = 50                  (§2; App. C)

- The discriminator loss is not back-propagated through the generator (§2: it cannot be,
  sampling is not differentiable); sampling runs under ``no_grad`` on detached logits.
- A sample that happens to equal the original token counts as "original" (label 0), as in
  the reference ``_get_fake_data``: ``labels = masked * (1 - equal(updated, original))``
  (google-research/electra run_pretraining.py).
- The discriminator loss averages sigmoid cross-entropy over every real token - including
  [CLS]/[SEP], excluding padding - with ``input_mask`` as weights
  (``_get_discriminator_output`` in the same file).
- Generator and discriminator share the whole embedding block: token, position and segment
  tables and their LayerNorm (§3.2, weight sharing; the reference builds both under the
  "electra/embeddings" variable scope). The generator is narrower (App. C Table 6: 1/4 of
  the hidden size, FFN and heads for ELECTRA-small), so it has its own E -> H_G projection,
  and its MLM decoder is tied to the shared (V, E) word embeddings.
- Only ``backbone.*`` (the discriminator) is kept for fine-tuning and export; the loader in
  ember.runs.init strips that prefix and ignores ``generator*`` and ``rtd_head.*``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ember.config import DataConfig, ElectraConfig, ModelConfig
from ember.data.pairs import SegmentPair
from ember.errors import EmberError
from ember.models.encoder import Encoder, init_weights
from ember.nn.heads import MaskedLMHead
from ember.nn.rtd import ReplacedTokenHead
from ember.objectives.bert import pack_joins, pack_pairs
from ember.objectives.masking import Masker, build_masker
from ember.objectives.mlm import token_prediction_loss

# Of the positions chosen for masking, the reference replaces 85% with [MASK] and leaves 15%
# unchanged - no random tokens, unlike BERT's 80/10/10 (pretrain_helpers.mask in
# google-research/electra). The generator then resamples all chosen positions anyway.
MASK_FRACTION = 0.85
_STATIC_TAG = 0xE1EC7A  # keeps the static [MASK]-or-keep draws apart from the masker's own stream


def generator_config(model: ModelConfig, electra: ElectraConfig) -> ModelConfig:
    """The generator's shape: hidden size, heads and FFN scaled by ``generator_size`` and
    layers by ``generator_layers`` (Clark et al. 2020, App. C Table 6 "Generator Size
    (multiplier for hidden-size, FFN-size, and num-attention-heads)"). It reads the
    discriminator's embeddings, so its embedding size E is the discriminator's."""
    if not 0.0 < electra.generator_size <= 1.0:
        raise EmberError(f"electra.generator_size={electra.generator_size}; use a fraction in (0, 1] "
                         "of the discriminator's hidden size (the paper uses 1/4 for small, 1/3 for base)")
    if not 0.0 < electra.generator_layers <= 1.0:
        raise EmberError(f"electra.generator_layers={electra.generator_layers}; use a fraction in (0, 1] "
                         "of the discriminator's layers")
    hidden = int(round(model.hidden_size * electra.generator_size))
    if hidden < 1:
        raise EmberError(f"electra.generator_size={electra.generator_size} leaves the generator no hidden "
                         f"units (discriminator hidden size {model.hidden_size}); raise it")
    heads = max(1, int(round(model.num_heads * electra.generator_size)))
    while hidden % heads:  # keep hidden/heads whole (e.g. H 32, 2 heads, 1/4 -> 8 units, 1 head)
        heads -= 1
    return dataclasses.replace(
        model,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=max(1, int(round(model.intermediate_size * electra.generator_size))),
        num_layers=max(1, int(round(model.num_layers * electra.generator_layers))),
        embedding_size=model.embedding_size or model.hidden_size,
        pooler=False,
    )


def sample_replacements(logits: torch.Tensor, temperature: float = 1.0,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits`` (N, V) from softmax(logits / temperature): Gumbel-max
    with ``torch.rand`` noise, as the reference ``sample_from_softmax``. Draws from torch's
    global RNG unless a ``generator`` is given; the Trainer seeds the global RNG per
    micro-batch, so runs and resumes repeat exactly."""
    if temperature <= 0:
        raise EmberError(f"electra.temperature={temperature}; use a positive sampling temperature")
    with torch.no_grad():
        u = torch.rand(logits.shape, device=logits.device, generator=generator)
        gumbel = -torch.log(-torch.log(u + 1e-9) + 1e-9)
        return (logits.detach().float() / temperature + gumbel).argmax(-1)  # (N,)


def replace_tokens(original: torch.Tensor, where: torch.Tensor, sampled: torch.Tensor):
    """Discriminator input and labels.

    original (B, T) ids, where (B, T) bool masked positions, sampled (N,) ids for them.
    Returns (ids (B, T) with the samples written in, labels (B, T) float: 1 = replaced).
    A sample equal to the original token is not a replacement (label 0).
    """
    ids = original.clone()
    ids[where] = sampled
    return ids, (ids != original).float()


def standalone_generator(state: dict[str, torch.Tensor], model: ModelConfig,
                         electra: ElectraConfig) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """An ELECTRA run's generator as an ember masked-LM model (``backbone.*`` + ``mlm.*``) with
    its own copy of the shared embeddings: the layout of the released "-generator"
    checkpoints (HF ElectraForMaskedLM), exportable with ember.interop.hf_electra."""
    out = {k: v.clone() for k, v in state.items() if k.startswith("backbone.embeddings.")}
    for key, value in state.items():
        if key.startswith("generator."):
            out["backbone." + key.removeprefix("generator.")] = value
        elif key.startswith("generator_head."):
            out["mlm." + key.removeprefix("generator_head.")] = value
    return generator_config(model, electra), out


@dataclass
class ElectraStep:
    """Everything one ELECTRA forward pass computes (tests and analysis read the parts)."""

    mlm_loss: torch.Tensor  # scalar, mean over masked positions
    rtd_loss: torch.Tensor  # scalar, mean over real tokens
    mlm_metrics: dict  # mlm_loss / mlm_acc as (sum, count)
    mlm_logits: torch.Tensor  # (N, V) generator logits at the masked positions
    targets: torch.Tensor  # (N,) original ids there
    sampled: torch.Tensor  # (N,) generator samples
    disc_ids: torch.Tensor  # (B, T) discriminator input
    rtd_labels: torch.Tensor  # (B, T) 1 = replaced
    rtd_logits: torch.Tensor  # (B, T)
    real: torch.Tensor  # (B, T) bool, attention_mask == 1


def build(cfg, special_ids: dict) -> "ElectraPretraining":
    masker = build_masker(cfg.data, special_ids, cfg.model.vocab_size, cfg.train.seed)
    return ElectraPretraining(cfg.model, cfg.electra, special_ids, cfg.data, masker)


class ElectraPretraining(nn.Module):
    """Discriminator ``backbone`` + ``rtd_head``; generator ``generator`` + ``generator_head``."""

    def __init__(self, model: ModelConfig, electra: ElectraConfig, special_ids: dict,
                 data: DataConfig, masker: Masker | None = None) -> None:
        super().__init__()
        from ember.models import build_backbone

        self.backbone = build_backbone(model)
        if self.backbone.embeddings is None:
            raise EmberError("the ELECTRA discriminator needs its own embeddings")
        gen = generator_config(model, electra)
        self.generator = Encoder(gen, embeddings=False)  # fed the discriminator's embeddings
        self.generator_head = MaskedLMHead(gen.hidden_size, model.vocab_size, model.hidden_act,
                                           model.layer_norm_eps, gen.embedding_size)
        self.rtd_head = ReplacedTokenHead(model.hidden_size, model.hidden_act)
        for head in (self.generator_head, self.rtd_head):
            head.apply(lambda m: init_weights(m, model.initializer_range))
        self.electra = electra
        self.special_ids = dict(special_ids)
        self.data = data
        # data.masking picks the positions (tokens, whole words, spans: ember.objectives.masking)
        self.masker = masker or build_masker(data, special_ids, model.vocab_size)
        # RTD is the only loss, so no NSP/SOP pairs: one [CLS] A [SEP] segment per sequence.
        # (The reference's data builder splits 90% of its sequences into two contiguous
        # segments with ids 0/1 but no pair label - build_pretraining_dataset.py.)
        self.pair_mode = "none"

    # -- data -----------------------------------------------------------------------------
    def make_batch(self, pairs: list[SegmentPair], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """[CLS] A [SEP]; ``data.masking`` chooses ~15% of the tokens (labels: their original
        ids); input_ids hold the generator's input: 85% of the chosen as [MASK], the rest kept."""
        ids, types, attention, maskable = pack_pairs(
            pairs, self.special_ids["cls"], self.special_ids["sep"], self.special_ids["pad"]
        )
        keys = [p.mask_key for p in pairs]
        # Only the masker's choice of positions is used; its 80/10/10 corruption is redrawn.
        labels = self.masker(ids, maskable, rng, joins=pack_joins(pairs, ids.shape[1]), keys=keys).labels
        to_mask = (labels != -100) & (self._mask_draws(ids.shape, keys, rng) < MASK_FRACTION)
        return {
            "input_ids": torch.from_numpy(np.where(to_mask, self.special_ids["mask"], ids)),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(labels),
        }

    def _mask_draws(self, shape: tuple[int, int], keys: list, rng: np.random.Generator) -> np.ndarray:
        """Uniform draws (B, T) for the [MASK]-or-keep choice: from the batch RNG, or keyed by
        each example's (index, epoch mod N) with static masks, so a sequence's N masks are fixed."""
        m = self.masker
        if not m.static_masks:
            return rng.random(shape)
        rows = [np.random.default_rng([m.seed, int(i), int(e) % m.static_masks, _STATIC_TAG]) for i, e in keys]
        return np.stack([r.random(shape[1]) for r in rows])

    # -- model ----------------------------------------------------------------------------
    def step(self, batch: dict[str, torch.Tensor]) -> ElectraStep:
        ids, types, attention = batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"]
        labels = batch["labels"]
        where = labels != -100  # (B, T) positions the generator predicts
        targets = labels[where]  # (N,)
        # Generator: shared embeddings (B, T, E) -> own E->H_G projection -> layers -> (N, H_G) at
        # the masked rows, its last layer computed only there (ember.nn.query_rows).
        gen = self.generator(ids, attention, types, inputs_embeds=self.backbone.embeddings(ids, types), rows=where)
        mlm_logits = self.generator_head(gen.last_hidden_state, self.backbone.word_embeddings)  # (N, V)
        mlm_loss, mlm_metrics = token_prediction_loss(mlm_logits, targets, "mlm")
        # Replacements: no gradient flows from the discriminator into the generator.
        # In eval mode the noise comes from a fixed seed, so held-out metrics of successive
        # evaluations see the same kind of draws and stay comparable.
        fixed = None if self.training else torch.Generator(mlm_logits.device).manual_seed(0)
        sampled = sample_replacements(mlm_logits, self.electra.temperature, fixed)
        original = torch.where(where, labels, ids)
        disc_ids, rtd_labels = replace_tokens(original, where, sampled)
        disc = self.backbone(disc_ids, attention, types)
        rtd_logits = self.rtd_head(disc.last_hidden_state).float()  # (B, T)
        real = attention.bool()
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits[real], rtd_labels[real])
        return ElectraStep(mlm_loss, rtd_loss, mlm_metrics, mlm_logits, targets, sampled, disc_ids,
                           rtd_labels, rtd_logits, real)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        s = self.step(batch)
        loss = s.mlm_loss + self.electra.discriminator_weight * s.rtd_loss
        return loss, self.metrics(s, loss)

    @staticmethod
    def metrics(s: ElectraStep, loss: torch.Tensor) -> dict:
        """name -> (sum, count), as the reference's eval metrics (run_pretraining.metric_fn)."""
        n_masked = int(s.targets.numel())
        labels = s.rtd_labels[s.real].bool()
        preds = s.rtd_logits[s.real] > 0
        n_real = int(labels.numel())
        hits = (preds == labels)
        b = int(s.real.shape[0])
        return {
            "loss": (loss.item() * b, b),
            **s.mlm_metrics,
            # share of masked positions whose sample differs from the original
            "replaced_frac": ((s.sampled != s.targets).sum().item(), n_masked),
            "rtd_loss": (s.rtd_loss.item() * n_real, n_real),
            "rtd_acc": (hits.sum().item(), n_real),
            "rtd_precision": ((hits & preds).sum().item(), int(preds.sum().item())),
            "rtd_recall": ((hits & labels).sum().item(), int(labels.sum().item())),
        }

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Discriminator logits (B, T) for ``input_ids`` as given (> 0: "replaced")."""
        out = self.backbone(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
        return self.rtd_head(out.last_hidden_state)
