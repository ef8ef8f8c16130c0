import pytest
import torch

from helpers import build_model
from hetbench.gradients import count_parameters
from hetbench.strategies.base import BatchOrder
from hetbench.workload import KeyedDropout, dropout_keys, keyed
from hetbench.workloads.mnist_cnn import Net


def test_cnn_has_the_example_parameter_count():
    assert count_parameters(Net()) == 1_199_882


def test_cnn_outputs_log_probabilities_for_ten_classes():
    out = Net(dropout=0.0)(torch.randn(5, 1, 28, 28))
    assert out.shape == (5, 10)
    assert torch.allclose(out.exp().sum(1), torch.ones(5), atol=1e-5)


def test_same_seed_same_initial_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_model(0.0, seed=7), build_model(0.0, seed=7)
    assert torch.rand(1) == before  # building a model does not consume the caller's random stream
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    c = build_model(0.0, seed=8)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_dropout_is_configurable_and_zero_is_deterministic():
    model = Net(dropout=0.0).train()
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(model(x), model(x))
    assert Net(dropout=0.5).dropout1.p == 0.5


def test_a_samples_dropout_mask_follows_its_key_not_its_batch():
    """Masks keyed by (seed, step, sample index): the same units drop for a sample whether it is
    computed alone, in a worker's slice or in the whole batch, in any order."""
    model = build_model(0.5, seed=0).train()
    x, index = torch.randn(6, 1, 28, 28), torch.tensor([9, 4, 17, 0, 3, 12])

    def forward(inputs, keys):
        with keyed(model, keys):
            return model(inputs)

    whole = forward(x, dropout_keys(1, 7, index))
    parts = [forward(x[s], dropout_keys(1, 7, index[s])) for s in (slice(0, 2), slice(2, 6))]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=1e-6)
    reversed_ = forward(x.flip(0), dropout_keys(1, 7, index.flip(0)))
    torch.testing.assert_close(reversed_.flip(0), whole, rtol=0, atol=1e-6)
    for other in (dropout_keys(2, 7, index), dropout_keys(1, 8, index)):  # another seed, another step
        assert not torch.allclose(forward(x, other), whole)


def test_keyed_masks_drop_the_rate_independently_per_sample_and_unit():
    layer = Net(dropout=0.25).dropout1.train()
    keys = dropout_keys(0, 0, torch.arange(512))
    with keyed(layer, keys):
        kept = layer(torch.ones(512, 9216)) != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.002  # 4.7M draws: the rate to within 0.2 points
    assert abs(kept.float().mean(0).std().item() - (0.75 * 0.25 / 512) ** 0.5) < 0.002  # units: binomial
    agree = (kept[:-1] == kept[1:]).float().mean().item()  # neighbouring samples: as two coins agree
    assert abs(agree - (0.75**2 + 0.25**2)) < 0.002
    with keyed(layer, keys[:2]):
        assert torch.equal(layer(torch.ones(2, 9216)).unique(), torch.tensor([0.0, 1 / 0.75]))


def test_keyed_masks_are_independent_across_units_layers_and_steps():
    """Each agreement between two masks is as two fair coins of the keep rate agree (p^2 + q^2), to
    within 4.7M draws' noise: neighbouring units of a sample, the same units in another layer, the
    same samples at another step (the worst of 8)."""
    net = Net(dropout=0.25).train()
    first, second = net.dropout1, KeyedDropout(0.25, layer=net.dropout1.layer + 1).train()
    ones, coins = torch.ones(512, 9216), 0.75**2 + 0.25**2

    def kept(layer, step):
        with keyed(layer, dropout_keys(0, step, torch.arange(512))):
            return layer(ones) != 0

    mask = kept(first, 0)
    assert abs((mask[:, :-1] == mask[:, 1:]).float().mean().item() - coins) < 0.002  # units
    assert abs((mask == kept(second, 0)).float().mean().item() - coins) < 0.002  # layers
    steps = [(mask == kept(first, step)).float().mean().item() for step in range(1, 9)]
    assert max(abs(agree - coins) for agree in steps) < 0.002


def test_a_batch_orders_keys_are_dropout_keys_of_its_steps_and_indices_across_epochs():
    order = BatchOrder(10, 4, seed=3)  # batch 2 takes the last 2 of epoch 0 and the first 2 of epoch 1
    for step in range(6):
        assert torch.equal(order.keys(step), dropout_keys(3, step, order(step)))


def test_training_with_dropout_needs_keys_and_evaluation_ignores_them():
    model, x = Net(dropout=0.25), torch.randn(3, 1, 28, 28)
    with pytest.raises(ValueError, match="needs its samples' keys"):
        model.train()(x)
    plain = model.eval()(x)
    with keyed(model, dropout_keys(0, 0, torch.arange(3))):
        assert torch.equal(model(x), plain)
