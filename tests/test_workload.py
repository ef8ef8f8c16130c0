import torch

from hetbench.gradients import count_parameters
from hetbench.workload import Net, build_model


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
