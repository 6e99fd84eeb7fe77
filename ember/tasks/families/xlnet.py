"""Fine-tuning XLNet (Yang et al. 2019, §3.3 and App. A.3) on every ember task.

Input layout. XLNet reads a sentence (pair) as it was pre-trained (``ember.objectives.plm``):

    A <sep> B <sep> <cls>      token types 0 .. 0 1 .. 1 2

with the classifier token at the *end*, and its tokenizer pads on the left. The relative
segment encoding (§2.5) only asks whether two positions share a type, so the <cls> (type 2)
is in a segment of its own. ``xlnet_template`` writes that template with the run's own
separator and classifier tokens (``<sep>``/``<cls>`` in XLNet's vocabulary, ``[SEP]``/``[CLS]``
in a WordPiece one), whatever template its tokenizer.json carries; a fine-tuned run keeps the
templated tokenizer (``run_tokenizer``), so serving and ``ember convert --to-hf`` read texts
the same way.

Heads. Sentence (pair) classification and regression read the last position through XLNet's
sequence summary - Linear(H, H), tanh, dropout - then a Linear(H, labels) (the released
``run_classifier.py``; transformers' ``XLNetForSequenceClassification``: ``sequence_summary``
and ``logits_proj``). CoNLL-2003 and SQuAD put the encoders' token heads on XLNet's states
(transformers' ``XLNetForTokenClassification`` / ``XLNetForQuestionAnsweringSimple``); SQuAD's
no-answer position is then the final <cls> (``ember.tasks.qa.squad``).

Backbone. Fine-tuning reads each text once, forward, with no memory: the released code builds
its fine-tuning model with ``mem_len``/``reuse_len`` None and ``bi_data`` False, and so does
``model_config``.
"""

from __future__ import annotations

import dataclasses
import json

import torch
from tokenizers import Tokenizer, processors
from torch import nn

from ember.tasks.classification import SequenceClassifier
from ember.tasks.glue_adapter import GlueAdapter
from ember.tasks.wrapped import WrappedAdapter

PAD_TYPE_ID = 3  # XLNet's tokenizer gives padding token type 3 (none of A, B, <cls>)


def xlnet_template(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of ``tokenizer`` whose template is XLNet's: ``A <sep> B <sep> <cls>`` (types 0/1/2).

    Byte-level BPE keeps its offset trimming (so SQuAD spans map to characters without the
    leading space) ahead of the template.
    """
    from ember.tokenizers import special_token_ids

    ids = special_token_ids(tokenizer)
    sep, cls = tokenizer.id_to_token(ids["sep"]), tokenizer.id_to_token(ids["cls"])
    template = processors.TemplateProcessing(
        single=f"$A:0 {sep}:0 {cls}:2", pair=f"$A:0 {sep}:0 $B:1 {sep}:1 {cls}:2",
        special_tokens=[(sep, ids["sep"]), (cls, ids["cls"])])
    tok = Tokenizer.from_str(tokenizer.to_str())
    pre = (json.loads(tok.to_str()).get("pre_tokenizer") or {}).get("type")
    tok.post_processor = (processors.Sequence([processors.ByteLevel(trim_offsets=True), template])
                          if pre == "ByteLevel" else template)
    return tok


def last_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B,) index of each row's last real token: T - 1 under XLNet's left
    padding, and still the <cls> when a caller pads on the right (the serving batches)."""
    t = attention_mask.shape[1]
    return (attention_mask * torch.arange(1, t + 1, device=attention_mask.device)).argmax(-1)


class XLNetClassifier(SequenceClassifier):
    """XLNet's sequence summary at the last real token, then the label layer (module docstring).

    State-dict names: ``summary.*`` (transformers' ``sequence_summary.summary``), ``classifier.*``
    (``logits_proj``), ``backbone.*``.
    """

    padding = {"left": True, "pad_type_id": PAD_TYPE_ID}

    def __init__(self, backbone: nn.Module, num_labels: int, pad_id: int) -> None:
        super().__init__(backbone, num_labels, pad_id)
        cfg = backbone.config
        self.summary = nn.Linear(cfg.hidden_size, cfg.hidden_size)  # (H) -> (H), then tanh
        nn.init.normal_(self.summary.weight, std=cfg.initializer_range)
        nn.init.zeros_(self.summary.bias)

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:  # (B, num_labels)
        hidden = out.last_hidden_state  # (B, T, H)
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_positions(attention_mask)]
        return self.classifier(self.dropout(torch.tanh(self.summary(last))))


class XLNetAdapter(WrappedAdapter):
    """A task's adapter for an XLNet backbone: XLNet's template everywhere, XLNet's
    classification head for sentence (pair) tasks, the task's own head otherwise."""

    def load(self, split, tokenizer, max_length, limit=None, path=None):
        return self.base.load(split, xlnet_template(tokenizer), max_length, limit=limit, path=path)

    def build_module(self, backbone: nn.Module, pad_id: int) -> nn.Module:
        if isinstance(self.base, GlueAdapter):
            return XLNetClassifier(backbone, self.base.spec.num_labels, pad_id)
        return self.base.build_module(backbone, pad_id)

    def predict_file(self, module, tokenizer, *args, **kwargs):
        return self.base.predict_file(module, xlnet_template(tokenizer), *args, **kwargs)

    def inference_methods(self, ctx) -> list:
        return self.base.inference_methods(dataclasses.replace(ctx, tokenizer=xlnet_template(ctx.tokenizer)))

    def model_config(self, model):
        """No memory and no mirrored half-batches when fine-tuning (module docstring). XLNet has
        no absolute positions (its relative encodings are computed for any length), so the
        segment length it was pre-trained on does not bound a fine-tuned input: ember's
        ``max_position`` (which only caps the input length here) is lifted to 512, the length
        XLNet fine-tuned SQuAD with (Yang et al. 2019, App. A.3, Table 8)."""
        return dataclasses.replace(model, mem_len=0, reuse_len=0, bi_data=False,
                                   max_position=max(model.max_position, FINETUNE_POSITIONS))

    def run_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return xlnet_template(tokenizer)


FINETUNE_POSITIONS = 512  # XLNet's SQuAD max_seq_length


def adapt(adapter, model) -> XLNetAdapter:
    return XLNetAdapter(adapter)
