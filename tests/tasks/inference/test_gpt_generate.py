"""GPT decoding: KV cache, left padding, greedy parity with Hugging Face, sampling, stops, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ember.config import model_preset
from ember.generate import (GenerationConfig, filter_logits, first_sentences, generate_ids,
                            generate_text, load_causal_lm)
from ember.models import build_backbone
from ember.objectives.clm import CausalLM
from gpt_helpers import make_gpt_run, tiny_model

@pytest.mark.parametrize("family", ["gpt2", "gpt"])
def test_gpt_kv_cache_logits_equal_full_recompute(family):
    model = tiny_model(family)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model.logits(ids)  # (2, 12, V) in one pass
        cache = model.backbone.new_cache()
        steps = [model.logits(ids[:, :5], cache=cache)]  # a 5-token prompt, then one token at a time
        for t in range(5, 12):
            steps.append(model.logits(ids[:, t : t + 1], cache=cache))
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_gpt_decoder_is_causal():
    model = tiny_model()
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[0, 6] = (ids[0, 6] + 1) % 97
    with torch.no_grad():
        a, b = model.logits(ids), model.logits(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_gpt2_residual_projection_init_is_scaled():
    cfg = dataclasses.replace(model_preset("gpt2-mini"), vocab_size=500)
    torch.manual_seed(0)
    backbone = build_backbone(cfg)
    expected = 0.02 / (2 * cfg.num_layers) ** 0.5
    down = torch.cat([layer.ffn.down.weight.flatten() for layer in backbone.layers])
    up = torch.cat([layer.ffn.up.weight.flatten() for layer in backbone.layers])
    assert abs(down.std().item() - expected) < 0.05 * expected
    assert abs(up.std().item() - 0.02) < 0.05 * 0.02


def test_gpt_batched_left_padded_generation_equals_one_prompt_at_a_time():
    model = tiny_model()
    prompts = [[5, 9, 11, 3, 40, 41, 42], [7, 8], [60, 61, 62, 63]]
    cfg = GenerationConfig(max_new_tokens=8, stop_at_eot=False)
    batched = generate_ids(model, prompts, cfg, eot_id=0)
    alone = [generate_ids(model, [p], cfg, eot_id=0)[0] for p in prompts]
    assert batched == alone and all(len(x) == 8 for x in batched)


def test_gpt_generation_stops_at_end_of_text():
    model = tiny_model()
    cfg = GenerationConfig(max_new_tokens=10)
    free = generate_ids(model, [[5, 6, 7]], dataclasses.replace(cfg, stop_at_eot=False), eot_id=0)[0]
    eot = free[3]  # pretend the 4th greedy token is end-of-text: generation must stop before it
    stopped = generate_ids(model, [[5, 6, 7]], cfg, eot_id=eot)[0]
    assert stopped == free[: free.index(eot)]


def test_gpt_sampling_filters_and_seed():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True, True]]
    probs = logits.softmax(-1)[0]  # 0.64, 0.23, 0.09, ...: top-p 0.8 keeps the first two
    assert probs[0] < 0.8 < probs[0] + probs[1]
    assert torch.isinf(filter_logits(logits, top_p=0.8)).tolist() == [[False, False, True, True, True]]
    model = tiny_model()
    sample = GenerationConfig(max_new_tokens=12, temperature=1.0, seed=7, stop_at_eot=False)
    a = generate_ids(model, [[1, 2, 3]], sample, eot_id=0)
    assert a == generate_ids(model, [[1, 2, 3]], sample, eot_id=0)  # seeded: reproducible
    assert a != generate_ids(model, [[1, 2, 3]], dataclasses.replace(sample, seed=8), eot_id=0)
    greedy = generate_ids(model, [[1, 2, 3]], GenerationConfig(max_new_tokens=12, stop_at_eot=False), eot_id=0)
    assert generate_ids(model, [[1, 2, 3]], dataclasses.replace(sample, top_k=1), eot_id=0) == greedy


def test_gpt_greedy_generation_equals_hf_generate():
    transformers = pytest.importorskip("transformers")
    from hf_interop_helpers import perturb

    from ember.interop import hf_gpt2

    torch.manual_seed(0)
    hf = perturb(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=3, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)), seed=3)
    with torch.no_grad():  # sharper logits, so that argmax is never a near tie
        hf.transformer.wte.weight.mul_(8.0)
    cfg = hf_gpt2.config_from_hf(hf.config.to_dict())
    ours = CausalLM(build_backbone(cfg)).eval()
    ours.load_state_dict(hf_gpt2.state_from_hf(hf.state_dict(), cfg))
    prompts = [[5, 9, 11, 3, 40, 41, 42], [7, 8, 50, 51, 52, 53, 54]]
    ids = torch.tensor(prompts)
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    mine = generate_ids(ours, prompts, GenerationConfig(max_new_tokens=20, stop_at_eot=False), eot_id=0)
    assert ref[:, 7:].tolist() == mine
    # Left-padded batch of unequal prompts: HF numbers positions from the mask as ember does.
    short = [[7, 8, 50]]
    padded = torch.tensor([[0, 0, 0, 0, 7, 8, 50], prompts[0]])
    mask = (torch.arange(7) >= 4).long()[None].repeat(2, 1)
    mask[1] = 1
    with torch.no_grad():
        ref = hf.generate(padded, attention_mask=mask, max_new_tokens=15, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    mine = generate_ids(ours, short + [prompts[0]], GenerationConfig(max_new_tokens=15, stop_at_eot=False), 0)
    assert ref[:, 7:].tolist() == mine


@pytest.fixture
def gpt_run(tmp_path):
    return make_gpt_run(tmp_path)


def test_gpt_generate_text_stop_sequence_and_cli(gpt_run, tmp_path, capsys):
    from ember.cli import main

    model, tok = load_causal_lm(gpt_run)
    cfg = GenerationConfig(max_new_tokens=20, stop_at_eot=False)
    free = generate_text(model, tok, ["The river"], cfg)[0]
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    assert stop and stop in free
    cut = generate_text(model, tok, ["The river"], dataclasses.replace(cfg, stop=(stop,)))[0]
    assert cut == free[: free.find(stop)]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The river\nThe bank opened\n")
    out = tmp_path / "out.jsonl"
    assert main(["generate", str(gpt_run), "--prompts-file", str(prompts), "--max-new-tokens", "6",
                 "--batch-size", "2", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["The river", "The bank opened"]
    assert main(["generate", str(gpt_run), "--prompt", "The town", "--tldr", "--max-new-tokens", "8"]) == 0
    (tmp_path / "empty.txt").write_text("\n\n")
    assert main(["generate", str(gpt_run), "--prompts-file", str(tmp_path / "empty.txt")]) == 1
    assert "empty.txt: file is empty" in capsys.readouterr().err
    # "\n" in a --prompt is a newline (as in --stop): the same continuation as a JSONL prompt with one
    (tmp_path / "two-lines.jsonl").write_text(json.dumps({"prompt": "The river\nThe bank"}) + "\n")
    sources = {"flag": ["--prompt", "The river\\nThe bank"], "file": ["--prompts-file", str(tmp_path / "two-lines.jsonl")]}
    for name, source in sources.items():
        assert main(["generate", str(gpt_run), *source, "--max-new-tokens", "6", "--no-progress",
                     "--out", str(tmp_path / f"{name}.jsonl")]) == 0
    rows = [json.loads((tmp_path / f"{name}.jsonl").read_text()) for name in sources]
    assert rows[0]["prompt"] == "The river\nThe bank" and rows[0] == rows[1]


def test_gpt_tldr_keeps_three_sentences():
    assert first_sentences("One. Two! Three? Four. Five.") == "One. Two! Three?"


def test_decoding_settings_given_as_none_from_python_are_one_clear_refusal():
    """{"top_p": None} from Python (the HTTP layer refuses JSON null first) was a TypeError in the
    range check; a setting with a default is refused as null, an optional one keeps its rule."""
    from ember.tasks.inference.generation import parse_decoding
    from ember.tasks.inference.requests import RequestError

    with pytest.raises(RequestError, match=r"'top_p' must be a number, not null \(leave it out for the default, 1.0\)"):
        parse_decoding({"top_p": None}, 64, 1000)
    assert parse_decoding({"temperature": None}, 64, 1000)["temperature"] == 0.0  # unset: greedy, as left out
    assert parse_decoding({"temperature": None, "top_p": 0.5}, 64, 1000)["temperature"] == 1.0
