"""ScalarMix (ELMo eq. 1): softmax weights times gamma over layer representations."""

import torch

from ember.nn.scalar_mix import ScalarMix


def test_scalar_mix_is_gamma_times_softmax_weighted_sum():
    torch.manual_seed(0)
    layers = [torch.randn(2, 3, 4) for _ in range(3)]
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.0, 1.0, 2.0]))
        mix.gamma.fill_(0.5)
    s = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0)
    expected = 0.5 * (s[0] * layers[0] + s[1] * layers[1] + s[2] * layers[2])
    torch.testing.assert_close(mix(layers), expected)
    assert abs(float(mix.layer_weights().sum()) - 1.0) < 1e-6


def test_scalar_mix_normalize_ignores_padding():
    torch.manual_seed(0)
    h = torch.randn(1, 4, 8)
    padded = torch.cat([h, torch.full((1, 2, 8), 100.0)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    mix = ScalarMix(1, normalize=True)
    out = mix([padded], mask)[:, :4]
    torch.testing.assert_close(out, ScalarMix(1, normalize=True)([h]))


def test_scalar_mix_learns_to_pick_the_informative_layer():
    torch.manual_seed(0)
    target = torch.randn(16, 5, 4)
    layers = [torch.randn(16, 5, 4), target, torch.randn(16, 5, 4)]
    mix = ScalarMix(3)
    opt = torch.optim.Adam(mix.parameters(), lr=0.1)
    for _ in range(200):
        loss = ((mix(layers) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert int(mix.layer_weights().argmax()) == 1
    assert float(mix.layer_weights()[1]) > 0.9
