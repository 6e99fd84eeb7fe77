"""Text-to-text inputs and outputs as token ids: encoding a task's examples with its template,
and decoding (greedy or beam search) in length-sorted batches (ember.tasks.text2text.task's training and scoring and
ember.tasks.text2text.methods' serving share both).

Input = the template's pieces tokenized without the tokenizer's template, then ``</s>``; too long
an input loses tokens from its longest text field, one at a time (BERT's pair rule), never from
the prefixes ("sst2 sentence:"). Target = the target text's tokens, then ``</s>``.
"""

from __future__ import annotations

from ember.errors import EmberError
from ember.tasks.batching import length_sorted_batches
from ember.tasks.featurize import Featurized

ANSWER_TOKENS = 32  # decoding budget of a free answer (SQuAD; BERT's max_answer_length is 30 pieces)
NO_GRAPH_REASON = ("a text-to-text model answers by decoding token by token, with a key/value cache that grows "
                   "each step; ember's export formats hold one forward pass (ids -> logits), verified against "
                   "the run on real inputs, which a decoding loop is not")


def _trim_longest_first(lengths: list[int], room: int) -> list[int]:
    """Lengths after cutting one token at a time from the longest piece until they fit ``room``."""
    lengths = list(lengths)
    over = sum(lengths) - room
    while over > 0:
        i = max(range(len(lengths)), key=lambda k: (lengths[k], k))  # a tie cuts the later piece
        second = max((n for k, n in enumerate(lengths) if k != i), default=0)
        step = max(1, min(over, lengths[i] - second))
        lengths[i] -= step
        over -= step
    return lengths


class Text2TextEncoder:
    """Examples -> features {"input_ids", "truncated", and "labels" (target ids + </s>) when
    ``target_limit`` is given}, for one template and tokenizer (see the module docstring)."""

    def __init__(self, template, tokenizer, max_length: int) -> None:
        from tokenizers import Tokenizer

        from ember.tokenizers import sequence_end_id

        self.template, self.max_length = template, max_length
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())  # private copy: no truncation/padding
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.eos_id = sequence_end_id(tokenizer)  # T5's and BART's </s>
        self._fixed: dict[str, list[int]] = {}  # the prefixes repeat: tokenized once
        self.longest_target = 0  # tokens with </s>, over every target encoded here (free-text budget)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def __call__(self, examples, target_limit: int | None = None, where: str = "") -> Featurized:
        pieces = [self.template.pieces(ex) for ex in examples]
        texts = [text for row in pieces for text, cut in row if cut]
        encoded = iter(self.tokenizer.encode_batch(texts, add_special_tokens=False) if texts else [])
        features, n_truncated = [], 0
        for ex, row in zip(examples, pieces):
            ids = [next(encoded).ids if cut else self._prefix(text) for text, cut in row]
            cuttable = [i for i, (_, cut) in enumerate(row) if cut]
            room = self.max_length - 1 - sum(len(part) for i, part in enumerate(ids) if i not in cuttable)
            if room < len(cuttable):
                prefixes = " ".join(text for text, cut in row if not cut)
                raise EmberError(f"max_length={self.max_length} leaves no room for text after the prefixes "
                                 f"{prefixes!r} of the text-to-text input and </s>; raise --max-length")
            full = [len(ids[i]) for i in cuttable]
            kept = _trim_longest_first(full, room)
            for i, n in zip(cuttable, kept):
                ids[i] = ids[i][:n]
            truncated = kept != full
            n_truncated += truncated
            feature = {"input_ids": [t for part in ids for t in part] + [self.eos_id], "truncated": truncated}
            if target_limit is not None:
                feature["labels"] = self._target(ex, target_limit, where)
            features.append(feature)
        return Featurized(features, n_truncated)

    def _prefix(self, text: str) -> list[int]:
        if text not in self._fixed:
            self._fixed[text] = self.ids(text)
        return self._fixed[text]

    def _target(self, example, limit: int, where: str) -> list[int]:
        target = self.template.target(example)
        labels = self.ids(target) + [self.eos_id]
        if len(labels) > limit:
            name = getattr(example, "guid", None) or getattr(example, "qid", "?")
            raise EmberError(f"{where}example {name}: its target {target[:60]!r} is {len(labels)} tokens with </s>, "
                             f"beyond the decoder's limit of {limit} (model.max_position, the most tokens ember "
                             "decodes); use a model with a larger model.max_position (relative positions allow "
                             "it) or leave such examples out of the file")
        self.longest_target = max(self.longest_target, len(labels))
        return labels

    def check_targets(self) -> None:
        """Every fixed target (label words, scores) must come back from the tokenizer as itself,
        or the model could never say it."""
        for text in self.template.target_texts():
            back = self.tokenizer.decode(self.ids(text))
            if not same_text(back, text):
                raise EmberError(f"the tokenizer cannot spell the target {text!r} (it decodes to {back!r}): its "
                                 "vocabulary lacks a character of it. Use a tokenizer trained on text that holds "
                                 "it (T5's layout: `ember tokenizer train --kind unigram`)")

    def budget(self, decoder_limit: int) -> int:
        """Tokens to decode per input: the longest fixed target + 1 (free answers: ANSWER_TOKENS;
        free text: twice the longest target encoded so far, at least ANSWER_TOKENS, or the decoder's
        limit before any target was seen), never beyond the decoder's limit."""
        if self.template.kind == "generate":
            return min(max(2 * self.longest_target, ANSWER_TOKENS) if self.longest_target else decoder_limit,
                       decoder_limit)
        targets = self.template.target_texts()
        longest = max((len(self.ids(t)) for t in targets), default=0)
        want = longest + 1 if self.template.kind == "classify" else max(longest + 1, ANSWER_TOKENS)
        return min(want, decoder_limit)


def same_text(decoded: str, text: str) -> bool:
    """Whether a tokenizer gave ``text`` back, as outputs are parsed and exact match compares: white
    space normalised (a byte-level BPE decodes "negative" as " negative", its word-start space)."""
    return " ".join(decoded.split()) == " ".join(text.split())


def batched_decode(backbone, inputs: list[list[int]], max_new_tokens: int, eos_id: int, batch_size: int = 64,
                   num_beams: int = 1, length_penalty: float = 1.0) -> list[list[int]]:
    """The output ids (without </s>) of each input, in input order: greedy, or beam search with
    ``num_beams`` > 1; batches are formed by input length to save padding (neither decoding of
    an input depends on its batch)."""
    from ember.seq2seq_generation import Seq2SeqGenerationConfig, seq2seq_generate_ids

    cfg = Seq2SeqGenerationConfig(max_new_tokens=max_new_tokens, num_beams=num_beams, length_penalty=length_penalty)
    out: list = [None] * len(inputs)
    for idx in length_sorted_batches([len(x) for x in inputs], batch_size):
        for i, ids in zip(idx, seq2seq_generate_ids(backbone, [inputs[i] for i in idx], cfg, eos_id)):
            out[i] = ids
    return out
