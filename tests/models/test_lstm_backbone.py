"""Dai & Le's LSTM backbone and its nn block: packed rows end in their own final state, a given
start state continues a sequence exactly, padding never leaks, every layer stacks for serving."""

from __future__ import annotations

import pytest
import torch

from lstm_helpers import lstm_by_hand, tiny_lstm_config


def _backbone(**extra):
    from ember.models import build_backbone

    torch.manual_seed(0)
    return build_backbone(tiny_lstm_config(**extra)).eval()


def test_lstm_backbone_matches_the_lstm_equations_by_hand_for_every_row_of_a_padded_batch():
    model = _backbone()
    ids = torch.tensor([[1, 3, 4, 5, 2], [1, 6, 2, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        out = model(ids, mask)
        for row, n in ((0, 5), (1, 3)):
            top, finals = lstm_by_hand(model.lstm.layers, model.embeddings.weight[ids[row, :n]])
            torch.testing.assert_close(out.last_hidden_state[row, :n], top, atol=1e-6, rtol=0)
            assert (out.last_hidden_state[row, n:] == 0).all()  # zeros at padding
            for layer, (h, c) in enumerate(finals):  # the state after the row's own last token
                torch.testing.assert_close(out.final_state[0][layer, row], h, atol=1e-6, rtol=0)
                torch.testing.assert_close(out.final_state[1][layer, row], c, atol=1e-6, rtol=0)


def test_lstm_initial_state_continues_the_sequence_exactly():
    """Reading a then b from a's final state == reading a + b in one go (every layer)."""
    model = _backbone()
    a, b = torch.tensor([[1, 3, 4, 2]]), torch.tensor([[2, 5, 6]])
    with torch.no_grad():
        first = model(a)
        second = model(b, initial_state=first.final_state)
        whole = model(torch.cat([a, b], dim=1))
        fresh = model(b)
    torch.testing.assert_close(second.last_hidden_state, whole.last_hidden_state[:, 4:], atol=1e-6, rtol=0)
    torch.testing.assert_close(second.final_state, whole.final_state, atol=1e-6, rtol=0)
    assert not torch.allclose(fresh.last_hidden_state, second.last_hidden_state, atol=1e-3)  # the state matters


def test_lstm_hidden_states_stack_embeddings_zero_padded_then_each_layer():
    model = _backbone()
    ids, mask = torch.tensor([[1, 3, 2, 0]]), torch.tensor([[1, 1, 1, 0]])
    with torch.no_grad():
        out = model(ids, mask, torch.zeros_like(ids), output_hidden_states=True)
    stacked = torch.stack(out.hidden_states)  # (L + 1, B, T, H): what serving's graph returns
    assert stacked.shape == (3, 1, 4, 4)
    torch.testing.assert_close(stacked[0, 0, :3, :3], model.embeddings.weight[ids[0, :3]])
    assert (stacked[0, :, :, 3:] == 0).all() and (stacked[0, 0, 3] == 0).all()  # E=3 padded to H=4; padding 0
    torch.testing.assert_close(stacked[-1], out.last_hidden_state)
    # ULMFiT's layer-wise rates place the embeddings at depth 0 and LSTM layer i at depth i.
    from ember.train.layerwise import parameter_depths
    from ember.tasks.families.lstm import LstmClassifier

    depths, layers = parameter_depths(LstmClassifier(model, 2, 0))
    assert layers == 2 and depths["backbone.embeddings.weight"] == 0
    assert depths["backbone.lstm.layers.1.weight_hh_l0"] == 2 and depths["classifier.weight"] == 3


def test_lstm_config_refuses_an_unknown_pooling_and_a_bad_embedding_dropout():
    from ember.errors import EmberError

    with pytest.raises(EmberError, match="lstm_pooling='mean'.*last, linear_gain"):
        tiny_lstm_config(lstm_pooling="mean")
    with pytest.raises(EmberError, match="embedding_dropout=1.0 must be in"):
        tiny_lstm_config(embedding_dropout=1.0)


def test_lstm_presets_have_the_papers_shape():
    from ember.config import model_preset
    from ember.models import build_backbone

    paper, mini = model_preset("lstm-dai-le"), model_preset("lstm-mini")
    assert (paper.family, paper.num_layers, paper.hidden_size, paper.embedding_size) == ("lstm", 1, 1024, 512)
    assert (mini.num_layers, mini.hidden_size, mini.embedding_size) == (1, 512, 256)
    with torch.device("meta"):
        lstm = build_backbone(paper).lstm.layers[0]
    # 4 gates x (input 512 + recurrent 1024 + 2 biases) x 1024 cells
    assert sum(p.numel() for p in lstm.parameters()) == 4 * 1024 * (512 + 1024 + 2)
