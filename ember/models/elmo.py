"""ELMo's bidirectional LSTM language model (Peters et al. 2018, §3.1 and §3.4).

    token representation x_k = proj(highway(charCNN(chars of word k)))     (B, T, P)
    forward LM:  L LSTM layers over x_1..x_T, layer j output h^fwd_{k,j}     (B, T, P)
    backward LM: L separate LSTM layers over x_T..x_1, h^bwd_{k,j}           (B, T, P)

The token representation is shared by both directions (and, in the objective, so is the
softmax). Each LSTM layer has ``hidden_size`` cells whose output is projected to P (the
paper: 4096 cells -> 512), and layers after the first add their input back (residual
connection). Sequences are right-padded; the backward LM reads each row reversed within its
own length, so padding never reaches a real position in either direction.

For feature-based transfer :meth:`ElmoBiLM.layers` gives every token's 2L+1 vectors as L+1
tensors of width 2P: layer 0 = [x_k; x_k] (the token layer duplicated to the width of the
others, as the paper does), layer j = [h^fwd_{k,j}; h^bwd_{k,j}]. A ScalarMix over them is
ELMo_k (eq. 1). No loss lives here: see ember.objectives.bilm.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ember.config import ElmoConfig
from ember.nn.char_cnn import CharCNN, parse_filters
from ember.nn.highway import Highway
from ember.nn.lstm import run_packed
from ember.tokenizers.words import NUM_CHARS, PAD_CHAR


@dataclass
class ElmoOutput:
    token: torch.Tensor  # (B, T, P)
    forward: list[torch.Tensor]  # L x (B, T, P), bottom layer first
    backward: list[torch.Tensor]  # L x (B, T, P), aligned with the input order


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first ``lengths[b]`` steps, leaving its padding in place.

    x (B, T, ...), lengths (B,). Applying it twice gives x back.
    """
    t = torch.arange(x.shape[1], device=x.device)[None, :]  # (1, T)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    idx = idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, idx)


class TokenEncoder(nn.Module):
    """Char CNN -> highway -> linear projection: a context-free vector per word (B, T, P)."""

    def __init__(self, cfg: ElmoConfig) -> None:
        super().__init__()
        self.cnn = CharCNN(NUM_CHARS, cfg.char_dim, parse_filters(cfg.filters), padding_idx=PAD_CHAR)
        self.highway = Highway(self.cnn.output_size, cfg.highway_layers)
        self.projection = nn.Linear(self.cnn.output_size, cfg.projection_dim)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        return self.projection(self.highway(self.cnn(char_ids)))


class LSTMStack(nn.Module):
    """L single-layer projected LSTMs, residual connections from the second layer on."""

    def __init__(self, cfg: ElmoConfig) -> None:
        super().__init__()
        p = cfg.projection_dim
        self.layers = nn.ModuleList(
            nn.LSTM(p, cfg.hidden_size, proj_size=p, batch_first=True) for _ in range(cfg.num_layers)
        )
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """x (B, T, P) right-padded to ``lengths`` (B,) -> L outputs (B, T, P), zeros at padding.
        Causal: output t depends on x_1..x_t only."""
        outputs = []
        for i, lstm in enumerate(self.layers):
            # Packed, so the LSTM steps only over real words (sentences vary a lot in length).
            h, _ = run_packed(lstm, self.dropout(x), lengths)
            x = h + x if i > 0 else h  # residual between LSTM layers (paper §3.4)
            outputs.append(x)
        return outputs


class ElmoBiLM(nn.Module):
    def __init__(self, cfg: ElmoConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.token_encoder = TokenEncoder(cfg)
        self.forward_lm = LSTMStack(cfg)
        self.backward_lm = LSTMStack(cfg)
        self.output_size = 2 * cfg.projection_dim  # width of every ELMo layer

    def forward(self, char_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> ElmoOutput:
        """char_ids (B, T, C), attention_mask (B, T) 1 = word -> ElmoOutput."""
        b, t = char_ids.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(b, t, dtype=torch.long, device=char_ids.device)
        lengths = attention_mask.long().sum(dim=1).clamp(min=1)  # packing needs >= 1 step
        x = self.encode_tokens(char_ids, attention_mask.bool())  # (B, T, P)
        fwd = self.forward_lm(x, lengths)
        bwd = [reverse_padded(h, lengths) for h in self.backward_lm(reverse_padded(x, lengths), lengths)]
        return ElmoOutput(x, fwd, bwd)

    def encode_tokens(self, char_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Token layer (B, T, P); zeros at padding. The char CNN runs once per distinct word of
        the batch (a batch of running text repeats "the", ",", ... many times), which cuts
        its cost several-fold with the same result."""
        uniq, inverse = torch.unique(char_ids[real], dim=0, return_inverse=True)  # (U, C), (N,)
        vectors = self.token_encoder(uniq)  # (U, P)
        x = vectors.new_zeros(*char_ids.shape[:2], vectors.shape[-1])
        x[real] = vectors[inverse]
        return x

    def layers(self, char_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The L+1 ELMo layers, each (B, T, 2P): [x; x], then [h_fwd_j; h_bwd_j] for j = 1..L."""
        out = self(char_ids, attention_mask)
        return [torch.cat([out.token, out.token], dim=-1)] + [
            torch.cat([f, b], dim=-1) for f, b in zip(out.forward, out.backward)
        ]


def load_elmo(run_dir: str | Path, device: str = "cpu"):
    """(ElmoBiLM in eval mode, WordVocab) from a run folder written by
    ``ember pretrain --recipe elmo-mini``."""
    from safetensors.torch import load_file

    from ember.config import load_yaml, run_config_from_dict
    from ember.errors import EmberError
    from ember.tokenizers.words import WordVocab

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise EmberError(f"{run_dir} is not an ember run folder (no config.yaml); pass the --out "
                         "folder of `ember pretrain --recipe elmo-mini`")
    cfg = run_config_from_dict(load_yaml(cfg_path), where=str(cfg_path))
    if cfg.objective != "bilm":
        raise EmberError(f"{run_dir} holds a {cfg.objective!r} run, not an ELMo biLM (objective bilm)")
    weights = run_dir / "model.safetensors"
    if not weights.is_file():
        raise EmberError(f"{weights} not found: the pre-training run has not finished "
                         "(continue it with `ember pretrain --out RUN --resume`)")
    state = {k[len("backbone."):]: v for k, v in load_file(str(weights)).items() if k.startswith("backbone.")}
    model = ElmoBiLM(cfg.elmo)
    model.load_state_dict(state)
    return model.to(device).eval(), WordVocab.load(run_dir / "words.json")


@torch.no_grad()
def sentence_layers(model: ElmoBiLM, vocab, sentences: list, batch_size: int = 64,
                    dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """The frozen biLM's layers for each sentence's words: one (n_words, L+1, 2P) tensor each.

    ``sentences``: strings (tokenized with the vocabulary's rule) or lists of words. Each is
    run as ``<s> words </s>``, as in pre-training; the marker positions are dropped.
    """
    device = next(model.parameters()).device
    words = [vocab.words_of(s) if isinstance(s, str) else [vocab.normalize(w) for w in s] for s in sentences]
    out: list[torch.Tensor] = []
    model.eval()
    for start in range(0, len(words), batch_size):
        chunk = [vocab.encode_sentence(w) for w in words[start : start + batch_size]]
        t = max(len(ids) for _, ids in chunk)
        chars = torch.zeros(len(chunk), t, vocab.max_word_chars, dtype=torch.long)
        mask = torch.zeros(len(chunk), t, dtype=torch.long)
        for i, (ch, ids) in enumerate(chunk):
            chars[i, : len(ids)] = torch.from_numpy(ch.astype("int64"))
            mask[i, : len(ids)] = 1
        layers = torch.stack(model.layers(chars.to(device), mask.to(device)), dim=2)  # (B, T, L+1, 2P)
        for i, (_, ids) in enumerate(chunk):
            out.append(layers[i, 1 : len(ids) - 1].to("cpu", dtype))
    return out
