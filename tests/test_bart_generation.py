"""BART generation (ember.seq2seq_generation): greedy and beam search give transformers'
``generate`` tokens on the same weights, with BART's decoding options (min length, no repeated
n-grams, forced first / last token), on right-padded batches of different lengths."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bart_helpers import EOS, PAD, VOCAB, ember_from_hf, tiny_hf_bart  # noqa: E402
from t5_helpers import one_thread  # noqa: E402,F401

from ember.errors import EmberError  # noqa: E402
from ember.seq2seq_generation import Seq2SeqGenerationConfig, banned_ngram_tokens, seq2seq_generate_ids  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

INPUTS = [[0, 17, 33, 45, 9, 12, 60, 2], [0, 5, 81, 7, 2], [0, 44, 44, 23, 71, 90, 13, 8, 19, 2]]


def _hf_new_tokens(hf, inputs, **kwargs) -> list[list[int]]:
    """transformers' generate on the right-padded batch, as ember returns it: the new tokens
    without the start token, cut before the first </s>."""
    width = max(len(x) for x in inputs)
    ids = torch.tensor([x + [PAD] * (width - len(x)) for x in inputs])
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=(ids != PAD).long(), do_sample=False, **kwargs)
    rows = []
    for row in out[:, 1:].tolist():
        rows.append(row[: row.index(EOS)] if EOS in row else row)
    return rows


CASES = {
    "greedy": dict(max_new_tokens=12),
    "greedy_min_length_no_repeat": dict(max_new_tokens=12, min_new_tokens=6, no_repeat_ngram_size=2),
    "beam4": dict(max_new_tokens=10, num_beams=4, length_penalty=2.0),
    "beam4_all_options": dict(max_new_tokens=10, num_beams=4, length_penalty=0.6, min_new_tokens=3,
                              no_repeat_ngram_size=3, forced_bos_token_id=0, forced_eos=True, early_stopping=True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mbart", [False, True], ids=["bart", "mbart"])
def test_bart_generate_equals_transformers_generate(case, mbart):
    hf = tiny_hf_bart(mbart, seed=11)
    with torch.no_grad():
        hf.final_logits_bias[0, EOS] += 4.0  # </s> competes: rows end at different lengths, min length binds
    ours = ember_from_hf(hf)
    opts = CASES[case]
    hf_opts = {k: v for k, v in opts.items() if k not in ("forced_eos", "forced_bos_token_id")}
    hf_opts["forced_eos_token_id"] = EOS if opts.get("forced_eos") else None
    hf_opts["forced_bos_token_id"] = opts.get("forced_bos_token_id")
    ref = _hf_new_tokens(hf, INPUTS, **hf_opts)
    got = seq2seq_generate_ids(ours, INPUTS, Seq2SeqGenerationConfig(**opts), EOS)
    assert got == ref
    if "min_new_tokens" in opts:
        assert all(len(r) >= opts["min_new_tokens"] for r in got)
    if opts.get("forced_bos_token_id") is not None:
        assert all(r[0] == opts["forced_bos_token_id"] for r in got)
    n = opts.get("no_repeat_ngram_size", 0)
    for r in got if n else []:
        grams = [tuple([EOS] + r)[i:i + n] for i in range(len(r) + 2 - n)]
        assert len(grams) == len(set(grams))
    if case == "greedy":  # without the options the model does end early or repeat: they change the output
        assert got != seq2seq_generate_ids(ours, INPUTS, Seq2SeqGenerationConfig(**CASES["greedy_min_length_no_repeat"]), EOS)


def test_bart_banned_ngram_tokens_by_hand():
    """Sequence 5 6 7 5 6: with n = 3 the prefix (5, 6) was followed by 7, so 7 is banned; with
    n = 2 the prefix (6,) was followed by 7 too; (n = 4: (7, 5, 6) never occurred) nothing."""
    seq = torch.tensor([[5, 6, 7, 5, 6]])
    assert banned_ngram_tokens(seq, 3, 10).nonzero()[:, 1].tolist() == [7]
    assert banned_ngram_tokens(seq, 2, 10).nonzero()[:, 1].tolist() == [7]
    assert banned_ngram_tokens(seq, 4, 10).nonzero().numel() == 0


def test_bart_generation_bad_lengths_are_one_clear_error():
    ours = ember_from_hf(tiny_hf_bart(seed=12))  # 40 learned positions
    with pytest.raises(EmberError, match="beyond the decoder's 40 positions"):
        seq2seq_generate_ids(ours, INPUTS, Seq2SeqGenerationConfig(max_new_tokens=41), EOS)
    with pytest.raises(EmberError, match="longer than the model's 40"):
        seq2seq_generate_ids(ours, [list(range(5, 46))], Seq2SeqGenerationConfig(max_new_tokens=5), EOS)
    with pytest.raises(EmberError, match="min_new_tokens=5 leaves no room"):
        Seq2SeqGenerationConfig(max_new_tokens=5, min_new_tokens=5)


def test_bart_greedy_decodes_as_many_tokens_as_it_has_positions():
    """Every one of the decoder's learned positions can hold a token the loop feeds: the start
    token and max_position - 1 new ones, whose last choice is never fed back. An output that
    never says </s> used to run one position past the end (min length one short of the limit keeps
    </s> out until the last token)."""
    hf = tiny_hf_bart(seed=3, max_position_embeddings=12)
    ours = ember_from_hf(hf)
    limit = ours.config.max_position
    cfg = Seq2SeqGenerationConfig(max_new_tokens=limit, min_new_tokens=limit - 1)
    got = seq2seq_generate_ids(ours, INPUTS[:2], cfg, EOS)
    assert all(len(r) >= limit - 1 for r in got)
    ref = _hf_new_tokens(hf, INPUTS[:2], max_new_tokens=limit, min_new_tokens=limit - 1)
    assert got == ref
