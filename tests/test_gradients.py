"""The synchronous update rule: workers with batches b1..bn step exactly like one device on the union batch.

`first_update_distributed` is the reference every strategy's equivalence test compares against.
"""

import multiprocessing as mp
import queue
import tempfile
from datetime import timedelta

import pytest
import torch

from helpers import build_model, forward_backward
from hetbench.gradients import (
    FlatModel,
    batch_shares,
    copies_ahead_safely,
    powersgd_fraction,
    weighted_allreduce,
    weighted_powersgd,
    weighted_sum,
)
from hetbench.strategies.base import BatchOrder, worker_slice
from hetbench.workload import build_optimizer, dropout_keys


def rule(grads, samples):
    """The synchronous update rule as every strategy applies it."""
    return weighted_sum(grads, batch_shares(samples))


BATCHES = [40, 24]


def union_batch(n=None, seed=0):
    n = n or sum(BATCHES)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def first_update_single(images, labels, optimizer="adadelta", lr=1.0):
    flat = FlatModel(build_model(0.0, seed=0))
    opt = build_optimizer(flat.model.parameters(), optimizer, lr)
    flat.zero_grad()
    forward_backward(flat.model, images, labels)
    opt.step()
    return flat.params.clone()


def worker_gradients(images, labels, batches, dropout=0.0, keys=None):
    """Each worker's mean-loss gradient on its contiguous slice of the union batch (with `dropout`,
    each slice's share of the samples' dropout `keys`)."""
    grads, offset = [], 0
    for b in batches:
        worker = FlatModel(build_model(dropout, seed=0))
        worker.zero_grad()
        part = slice(offset, offset + b)
        forward_backward(worker.model, images[part], labels[part], None if keys is None else keys[part])
        grads.append(worker.grads.clone())
        offset += b
    return grads


def first_update_distributed(images, labels, batches, optimizer="adadelta", lr=1.0):
    """Each worker's gradient on its slice, combined by the rule, applied by one optimizer."""
    grads = worker_gradients(images, labels, batches)
    server = FlatModel(build_model(0.0, seed=0))
    opt = build_optimizer(server.optimizer_params(), optimizer, lr)  # as the strategies build theirs
    server.grads.copy_(rule(grads, batches))
    opt.step()
    return server.params.clone()


@pytest.mark.parametrize("optimizer", ["adadelta", "adafactor"])
def test_the_optimizer_steps_the_flat_models_parameters_as_it_steps_the_models_own(optimizer):
    """Adafactor keeps a 2-D parameter's statistics by row and column: it steps alike only where it is
    given the parameters shaped as the model has them, not pieces of the flat buffer."""
    images, labels = union_batch()
    flat, plain = FlatModel(build_model(0.0, seed=0)), build_model(0.0, seed=0)
    initial = flat.params.clone()

    def make(params):
        return (
            torch.optim.Adafactor(params, lr=0.01)
            if optimizer == "adafactor"
            else build_optimizer(params, optimizer, 1.0)
        )

    opts = [make(plain.parameters()), make(flat.optimizer_params())]
    assert [p.shape for p in flat.optimizer_params()] == [p.shape for p in plain.parameters()]
    for step in range(3):
        batch = slice(step * 16, (step + 1) * 16)
        plain.zero_grad()
        forward_backward(plain, images[batch], labels[batch])
        flat.zero_grad()
        forward_backward(flat.model, images[batch], labels[batch])
        for opt in opts:
            opt.step()
    assert not torch.equal(flat.params, initial)  # it did train
    trained = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
    torch.testing.assert_close(flat.params, trained, rtol=0, atol=1e-6)


def test_a_gradient_of_another_size_is_refused_not_resized_into_the_buffer():
    buffer = torch.zeros(10)
    with pytest.raises(ValueError, match="a gradient of 7 values, where the model has 10"):
        weighted_sum([torch.ones(10), torch.ones(7)], [0.5, 0.5], out=buffer)
    assert buffer.shape == (10,)


def test_flat_model_parameters_and_gradients_are_views_of_two_buffers():
    flat = FlatModel(build_model(0.0, seed=0))
    images, labels = union_batch(8)
    flat.zero_grad()
    forward_backward(flat.model, images, labels)
    assert flat.grads.abs().sum() > 0
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in flat.model.parameters()]), flat.grads)
    flat.params.zero_()
    assert all(p.abs().sum() == 0 for p in flat.model.parameters())


class On:
    """A tensor's stand-in on `device`, pinned or not (pinning and CUDA need a CUDA build)."""

    def __init__(self, device: str, pinned: bool = False) -> None:
        self.device, self.pinned = torch.device(device), pinned

    def is_pinned(self) -> bool:
        return self.pinned


def test_weights_are_copied_ahead_only_from_pinned_memory_to_cuda():
    assert copies_ahead_safely(On("cpu", pinned=True), On("cuda"))
    assert not copies_ahead_safely(torch.zeros(4), On("cuda"))  # pageable: a temporary may be freed meanwhile
    assert not copies_ahead_safely(On("cpu", pinned=True), On("mps"))  # pytorch/pytorch#189690
    assert not copies_ahead_safely(torch.zeros(4), torch.zeros(4))
    flat = FlatModel(build_model(dropout=0.0, seed=0))
    flat.load_params(torch.ones_like(flat.params))
    assert torch.equal(flat.params, torch.ones_like(flat.params))


# Adam is left out on purpose: its first step is lr*sign(g), so float rounding on near-zero
# gradients flips whole steps; the gradient-level test below covers the rule for it.
@pytest.mark.parametrize("optimizer,lr", [("adadelta", 1.0), ("sgd", 0.05)])
def test_weighted_mean_of_unequal_batches_equals_the_union_batch_step(optimizer, lr):
    images, labels = union_batch()
    single = first_update_single(images, labels, optimizer, lr)
    distributed = first_update_distributed(images, labels, BATCHES, optimizer, lr)
    assert torch.allclose(single, distributed, atol=1e-5, rtol=0)


def test_combined_gradient_equals_the_union_batch_gradient():
    images, labels = union_batch()
    union = FlatModel(build_model(0.0, seed=0))
    union.zero_grad()
    forward_backward(union.model, images, labels)
    grads = worker_gradients(images, labels, BATCHES)
    assert torch.allclose(rule(grads, BATCHES), union.grads, atol=1e-6, rtol=0)


def test_with_keyed_dropout_the_split_gradient_is_still_the_union_batch_gradient():
    """Dropout's masks follow the samples (workload.dropout_keys), so the rule holds with dropout on."""
    images, labels = union_batch()
    keys = dropout_keys(0, 3, torch.arange(len(labels)) * 11)
    union = FlatModel(build_model(0.5, seed=0))
    union.zero_grad()
    forward_backward(union.model, images, labels, keys)
    grads = worker_gradients(images, labels, BATCHES, dropout=0.5, keys=keys)
    assert torch.allclose(rule(grads, BATCHES), union.grads, atol=1e-6, rtol=0)
    without_dropout = worker_gradients(images, labels, BATCHES)  # guards the test: dropout did act
    assert not torch.allclose(rule(without_dropout, BATCHES), union.grads, atol=1e-3)


def test_unweighted_mean_would_differ():
    """Guards the test above: equal weights for unequal batches is measurably a different step."""
    images, labels = union_batch()
    grads = worker_gradients(images, labels, BATCHES)
    assert not torch.allclose(rule(grads, BATCHES), (grads[0] + grads[1]) / 2, atol=1e-6)


def test_prescaled_sum_equals_weighted_mean():
    """The all-reduce form (multiply by b_i/B, then SUM) is the same rule."""
    grads = [torch.randn(100), torch.randn(100), torch.randn(100)]
    samples = [7, 50, 3]
    summed = sum(g * s for g, s in zip(grads, batch_shares(samples)))
    assert torch.allclose(summed, rule([g.clone() for g in grads], samples), atol=1e-6)


def test_batch_order_is_deterministic_and_covers_each_epoch_once():
    n, batch = 100, 32
    order = BatchOrder(n, batch, seed=3)
    steps = [order(s) for s in range(25)]
    assert all(len(s) == batch for s in steps)
    assert (BatchOrder(n, batch, seed=3)(4) == steps[4]).all()  # from (seed, step) alone, in any process
    assert not (BatchOrder(n, batch, seed=4)(4) == steps[4]).all()
    stream = torch.cat(steps)
    assert sorted(stream[:100].tolist()) == list(range(100))  # epoch 0 is a permutation
    assert sorted(stream[100:200].tolist()) == list(range(100))
    assert not (stream[:100] == stream[100:200]).all()  # and epoch 1 another
    assert len(order.epochs) <= 2  # what a step may span, no more kept


def test_worker_slices_partition_the_global_batch_in_worker_order():
    indices = BatchOrder(1000, 64, seed=0)(0)
    parts = [worker_slice(indices, BATCHES, r) for r in range(len(BATCHES))]
    assert [len(p) for p in parts] == BATCHES
    assert (torch.cat(parts) == indices).all()


def _rank(rank: int, init: str, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    share = [0.625, 0.375][rank]  # batches 40 and 24 of 64
    flat = FlatModel(build_model(0.0, seed=0))
    flat.grads.fill_(float(rank + 1))  # rank 0's gradient is all 1s, rank 1's all 2s
    # ray-train's form: a reused float32 staging buffer, the result copied into the views
    flat.grads.copy_(weighted_allreduce(flat.grads, share, "float32", torch.zeros_like(flat.grads)).wait())
    first = next(flat.model.parameters())
    views_intact = torch.equal(first.grad.reshape(-1), flat.grads[: first.numel()])
    staged = (flat.grads.min().item(), flat.grads.max().item(), views_intact)
    # torch-ddp's hook form: no staging buffer, bfloat16 on the wire, float32 back
    bucket = torch.full((1000,), float(rank + 1))
    reduced = weighted_allreduce(bucket, share, "bfloat16").wait()
    results.put((rank, staged, (reduced.min().item(), reduced.max().item(), reduced.dtype)))
    dist.destroy_process_group()


def two_gloo_ranks(target) -> list:
    """What `target(rank, init, results)` put in `results` from each of two spawned gloo ranks, by rank.
    They meet at a file store, not a TCP port: no port to find free and lose to another test."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        results, init = ctx.Queue(), f"file://{folder}/store"
        procs = [ctx.Process(target=target, args=(r, init, results), daemon=True) for r in range(2)]
        for p in procs:
            p.start()
        try:
            return sorted(results.get(timeout=120) for _ in procs)
        except queue.Empty:
            raise AssertionError("gloo ranks did not finish") from None
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()


def test_weighted_allreduce_applies_the_rule_across_two_gloo_ranks_in_either_wire_dtype():
    got = two_gloo_ranks(_rank)
    expected = 0.625 * 1 + 0.375 * 2  # exact in float32 and in bfloat16
    for _, staged, unstaged in got:
        assert staged == (expected, expected, True)
        assert unstaged == (expected, expected, torch.float32)


def _one_sample_gradient(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    """A linear layer's gradient from one sample: an outer product, so of rank 1."""
    x = torch.randn(1, model.in_features, generator=torch.Generator().manual_seed(100 * step + rank))
    model.zero_grad()
    (model(x) ** 2).sum().backward()
    return model.weight.grad.clone()


def _powersgd_rank(rank: int, init: str, results) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    shares = [0.625, 0.375]
    got = {}
    for staged in (False, True):  # the bucket itself (CPU, CUDA), and a CPU copy of it (MPS's path)
        model = torch.nn.Linear(64, 32, bias=False)
        torch.nn.init.normal_(model.weight, generator=torch.Generator().manual_seed(0))
        reference = torch.nn.Linear(64, 32, bias=False)
        reference.load_state_dict(model.state_dict())
        ddp = DistributedDataParallel(model, init_sync=False)
        state = PowerSGDState(None, matrix_approximation_rank=4, start_powerSGD_iter=2, random_seed=0)
        staging = torch.empty(model.weight.numel()) if staged else None
        ddp.register_comm_hook((state, staging), lambda held, bucket: weighted_powersgd(bucket, shares[rank], *held))
        errors = []
        for step in range(4):  # steps 0-1: plain all-reduces; 2-3: PowerSGD
            mine = [_one_sample_gradient(reference, r, step) for r in range(2)]
            model.zero_grad()
            x = torch.randn(1, 64, generator=torch.Generator().manual_seed(100 * step + rank))
            (ddp(x) ** 2).sum().backward()
            expected = shares[0] * mine[0] + shares[1] * mine[1]  # of rank 2: rank-4 factors hold it
            errors.append(((model.weight.grad - expected).abs().max() / expected.abs().max()).item())
        sent = state.total_numel_after_compression / state.total_numel_before_compression
        got[staged] = (errors, sent, model.weight.grad.tolist())  # a list: a tensor's memory leaves with the process
    results.put((rank, got, powersgd_fraction(model, 4)))
    dist.destroy_process_group()


def test_powersgd_through_torchs_hook_applies_the_rule_and_sends_the_share_it_says():
    for _, got, fraction in two_gloo_ranks(_powersgd_rank):
        for errors, sent, _ in got.values():
            assert max(errors) < 1e-4, errors  # the sample-weighted mean, before and after compression starts
            assert sent == fraction == (32 + 64) * 4 / (32 * 64)  # the factors of a 32 x 64 matrix at rank 4
        staged, direct = torch.tensor(got[True][2]), torch.tensor(got[False][2])
        assert torch.allclose(staged, direct, atol=1e-6)  # the CPU copy's path: the same result
