"""Fine-tuning BART with the paper's task heads (Lewis et al. 2020, §3.1-3.2).

Sequence classification (§3.1): "the same input is fed into the encoder and decoder, and the
final hidden state of the final decoder token is fed into new multi-class linear classifier"
- the token being the final ``</s>``, which plays BERT's [CLS]. The decoder reads the input
shifted right (``</s>`` first, ``EncoderDecoder.shift_right``), so the final decoder state is
the one at the last ``</s>`` of the input. The head is transformers'
``BartClassificationHead`` (and fairseq's): dropout, Linear(H, H), tanh, dropout,
Linear(H, labels). A pair is one sequence, ``<s> A </s></s> B </s>``: the byte-level BPE
template of ember's tokenizers (RoBERTa's), which BART shares.

Token classification and extractive QA (§3.2): "the complete document [is fed] into the encoder
and decoder, using the top hidden state of the decoder as a representation for each word": the
start/end layer of SQuAD (``qa_outputs``, transformers' ``BartForQuestionAnswering``) reads the
decoder's final states of ``<s> question </s></s> context </s>``; windows, n-best decoding
and the official metric are ember's SQuAD pipeline (``ember.tasks.qa``). Tagging (CoNLL-2003,
your own ``tag`` files) puts BERT's token layer (dropout, Linear(H, tags), a word's first
sub-token) on the same states. As in transformers' BART heads, the state at position t reads
the decoder's input shifted right (the tokens before t) and the whole input, token t included,
through cross-attention; transformers has no BartForTokenClassification, so that head is
checked through its backbone part (``BartModel``'s last_hidden_state) and on real CoNLL rows.

Every head run still holds a whole sequence-to-sequence LM: BART's output layer is the shared
embedding table plus ``final_logits_bias`` (both in the backbone), so the adapters also serve
``/score`` and ``/generate`` with the run's backbone (``lm_model``; ``ember.serve.predictor``),
the methods of a plain BART run. A fine-tuned backbone's LM drifts from the pre-trained one:
the task loss moves the decoder and the embeddings, never the bias.

``adapt`` is ``ember.tasks.base.FAMILY_ADAPTERS["bart"]``: GLUE-style tasks (your own
classify / pair / regression files too) get the classification head, SQuAD (and ``qa``
files) the span head, CoNLL-2003 (and ``tag`` files) the token layer, every other task
(``text2text`` files) fine-tunes text to text on T5's adapters; ``--set task.text2text=true``
fine-tunes classification and SQuAD text to text too.
The heads are not T5 code: they only call the encoder-decoder's forward.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.errors import EmberError
from ember.models.encoder import EncoderOutput
from ember.nn.pooling import last_positions
from ember.tasks.classification import SequenceClassifier
from ember.tasks.glue_adapter import GlueAdapter
from ember.tasks.qa.head import QuestionAnswering
from ember.tasks.tagging import ConllNerAdapter, TokenClassifier
from ember.tasks.wrapped import WrappedAdapter

# transformers' BartConfig.classifier_dropout (fairseq's pooler_dropout): 0.0 by default.
CLASSIFIER_DROPOUT = 0.0


def decoder_states(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   output_hidden_states: bool = False) -> EncoderOutput:
    """The same input through both stacks (§3.1): ``last_hidden_state`` (B, T, H) is the
    decoder's, reading ``input_ids`` shifted right under its causal mask (as transformers'
    BART heads: no decoder padding mask, right padding never reaches a real token);
    ``hidden_states`` are the encoder's (L + 1 of them, what ``embed`` serves)."""
    out = backbone(input_ids, attention_mask, decoder_input_ids=backbone.shift_right(input_ids),
                   output_hidden_states=output_hidden_states)
    return EncoderOutput(last_hidden_state=out.last_hidden_state, hidden_states=out.encoder_hidden_states)


def _need_decoder(backbone: nn.Module) -> None:
    if not hasattr(backbone, "shift_right"):
        raise EmberError("BART's task heads read the decoder's final states (Lewis et al. 2020 §3), but this "
                         "backbone has no decoder (--features freezes an encoder): drop --features")


class BartClassifier(SequenceClassifier):
    """BART's sequence classifier (module docstring). State-dict names: ``backbone.*``,
    ``dense.*`` and ``classifier.*`` (transformers' ``classification_head.dense`` /
    ``.out_proj``)."""

    def __init__(self, backbone: nn.Module, num_labels: int, pad_id: int) -> None:
        _need_decoder(backbone)
        super().__init__(backbone, num_labels, pad_id, dropout=CLASSIFIER_DROPOUT)
        cfg = backbone.config
        self.eos_id = cfg.decoder_start_id  # BART's decoder starts from </s>: the same id
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)  # (H) -> (H), then tanh
        nn.init.normal_(self.dense.weight, std=cfg.initializer_range)
        nn.init.zeros_(self.dense.bias)

    def backbone_pass(self, input_ids, attention_mask, token_type_ids=None, output_hidden_states=False):
        """The pass ``head_logits`` reads (``ember.serve.graph.InferenceGraph`` calls it too);
        BART has no segments, so ``token_type_ids`` are not read."""
        return decoder_states(self.backbone, input_ids, attention_mask, output_hidden_states)

    def head_logits(self, out, attention_mask: torch.Tensor) -> torch.Tensor:  # (B, num_labels)
        """The final decoder state of each row (its last real token: the template's final
        </s>, which ``logits`` checks) through dense, tanh and the label layer."""
        hidden = out.last_hidden_state  # (B, T, H)
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_positions(attention_mask)]
        return self.classifier(self.dropout(torch.tanh(self.dense(self.dropout(last)))))

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        ends = ids.gather(1, last_positions(mask)[:, None]).squeeze(1)
        if bool((ends != self.eos_id).any()):
            raise EmberError(f"BART's classifier reads the final </s> (id {self.eos_id}) of each input, but a row "
                             f"ends with id {int(ends[ends != self.eos_id][0])}: encode texts with the run's "
                             "tokenizer template (<s> A </s></s> B </s>)")
        return self.head_logits(self.backbone_pass(ids, mask), mask)


class BartQuestionAnswering(QuestionAnswering):
    """The start/end layer on the decoder's final states (§3.2; state-dict names ``backbone.*``,
    ``qa_outputs.*`` as transformers' ``BartForQuestionAnswering``)."""

    def __init__(self, backbone: nn.Module, pad_id: int) -> None:
        _need_decoder(backbone)
        super().__init__(backbone, pad_id)

    def backbone_pass(self, input_ids, attention_mask, token_type_ids=None, output_hidden_states=False):
        return decoder_states(self.backbone, input_ids, attention_mask, output_hidden_states)

    def logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.backbone_pass(batch["input_ids"], batch["attention_mask"])
        start, end = self.head_logits(out, batch["attention_mask"]).unbind(1)
        return start, end


class BartTokenClassifier(TokenClassifier):
    """BERT's token layer on the decoder's final states (§3.2; state-dict names ``backbone.*``,
    ``classifier.*``). Dropout: the backbone's, as BERT's tagger (transformers' token heads use
    ``classifier_dropout`` or else the hidden dropout)."""

    def __init__(self, backbone: nn.Module, num_labels: int, pad_id: int) -> None:
        _need_decoder(backbone)
        super().__init__(backbone, num_labels, pad_id)

    def backbone_pass(self, input_ids, attention_mask, token_type_ids=None, output_hidden_states=False):
        return decoder_states(self.backbone, input_ids, attention_mask, output_hidden_states)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # (B, T, num_labels)
        return self.head_logits(self.backbone_pass(batch["input_ids"], batch["attention_mask"]),
                                batch["attention_mask"])


class _HeadAdapter(WrappedAdapter):
    """A task with one of BART's heads; the run also serves its backbone's LM (module docstring)."""

    def lm_model(self, module: nn.Module | None, run_dir):
        """The seq2seq LM of a head run: the served module's backbone (the same tensors, no second
        copy) or, when the graph runs elsewhere (ONNX), the backbone loaded from the run folder;
        None when the folder holds no PyTorch weights (an ONNX export)."""
        from pathlib import Path

        if module is not None:
            return module.backbone
        if not (Path(run_dir) / "model.safetensors").is_file():
            return None
        from ember.seq2seq_generation import load_seq2seq_lm

        return load_seq2seq_lm(run_dir)[0]

    def inference_methods(self, ctx) -> list:
        from ember.tasks.text2text.methods import seq2seq_lm_methods

        return self.base.inference_methods(ctx) + (seq2seq_lm_methods(ctx) if ctx.model is not None else [])


class BartGlueAdapter(_HeadAdapter):
    """A sentence (pair) classification / regression task with BART's classification head."""

    def build_module(self, backbone: nn.Module, pad_id: int) -> BartClassifier:
        return BartClassifier(backbone, self.base.spec.num_labels, pad_id)


class BartSquadAdapter(_HeadAdapter):
    """SQuAD (or your own ``qa`` files) with the span layer on BART's decoder states."""

    def build_module(self, backbone: nn.Module, pad_id: int) -> BartQuestionAnswering:
        return BartQuestionAnswering(backbone, pad_id)


class BartTagAdapter(_HeadAdapter):
    """CoNLL-2003 (or your own ``tag`` files) with the token layer on BART's decoder states."""

    def build_module(self, backbone: nn.Module, pad_id: int) -> BartTokenClassifier:
        return BartTokenClassifier(backbone, len(self.base.labels), pad_id)


def adapt(adapter, model, settings=None):
    """BART's form of a task's adapter (module docstring); ``settings``: the run's TaskConfig."""
    from ember.tasks.qa.task import SquadAdapter
    from ember.tasks.text2text.task import adapt as text2text

    if settings is not None and getattr(settings, "text2text", False):
        return text2text(adapter, model)
    if isinstance(adapter, GlueAdapter):
        return BartGlueAdapter(adapter)
    if isinstance(adapter, SquadAdapter):
        return BartSquadAdapter(adapter)
    if isinstance(adapter, ConllNerAdapter):
        return BartTagAdapter(adapter)
    return text2text(adapter, model)
