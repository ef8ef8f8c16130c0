"""The device gate: the model must train on the device, and a CUDA desk's driver and GPU must be ones
torch's CUDA 13 build runs on; each refusal one sentence naming the fix. No GPU needed: nvidia-smi's
answer and torch's CUDA queries are stand-ins where a GPU would give them."""

from __future__ import annotations

import pytest
import torch

from hetbench import device_check
from hetbench.errors import UserError

TURING = {"name": "NVIDIA GeForce RTX 2080", "driver": "580.65.06", "capability": "7.5"}


def test_the_model_trains_on_the_cpu_and_says_in_what_precisions():
    has = "(one forward and backward pass; it has fp32, tf32, bf16, fp16)"
    assert device_check.require("cpu") == [f"cpu: cpu trains the model in fp32 {has}"]
    assert device_check.require("cpu", precision="bf16") == [f"cpu: cpu trains the model in bf16 {has}"]


@pytest.mark.parametrize(
    "gpu, refusal",
    [
        ({**TURING, "driver": "550.120"}, "driver here is 550.120 and torch .* needs 580 or newer: install a 580\\+"),
        ({**TURING, "name": "Tesla P100", "capability": "6.0"}, "Tesla P100 is compute capability 6.0 .* needs 7.5"),
    ],
)
def test_an_old_driver_or_gpu_is_refused_with_its_fix(monkeypatch, gpu, refusal):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # what an old driver looks like to torch
    with pytest.raises(UserError, match=refusal) as refused:
        device_check.require("cuda", lambda index: gpu)
    assert "\n" not in str(refused.value)


def test_a_cuda_build_that_sees_no_gpu_names_the_container_toolkit(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(UserError, match="no CUDA device is visible here .*`nvidia-ctk runtime configure"):
        device_check.require("cuda:1", lambda index: None)


def test_a_cpu_build_asked_for_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(UserError, match=r"is a CPU build and cannot use 'cuda'"):
        device_check.require("cuda", lambda index: TURING)


def test_a_supported_driver_and_gpu_pass():
    device_check.check_driver(TURING)
    device_check.check_driver({**TURING, "driver": "590.1", "capability": "12.0"})
    device_check.check_driver(None)  # no nvidia-smi: torch's own check decides


def test_a_device_that_cannot_run_the_model_is_refused_in_one_sentence(monkeypatch):
    from hetbench.workload import LoadedWorkload

    def no_kernel(self, model, inputs, labels, keys, precision):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device\nCompile with ...")

    monkeypatch.setattr(LoadedWorkload, "forward_backward", no_kernel)
    with pytest.raises(UserError) as refused:
        device_check.require("cpu")
    assert str(refused.value) == (
        "the model does not train on cpu: CUDA error: no kernel image is available for execution on the device"
    )


def test_nvidia_smi_is_read_per_gpu(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA RTX 4090, 580.65.06, 8.9'\necho 'Quadro P4000, 580.65.06, 6.1'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert device_check.nvidia_smi(1) == {"name": "Quadro P4000", "driver": "580.65.06", "capability": "6.1"}
    assert device_check.nvidia_smi(2) is None


def test_precision_sets_tf32_off_or_on_and_is_what_a_worker_reports(tmp_path):
    import torch

    from helpers import small_config
    from hetbench.devices import set_precision

    assert small_config(tmp_path).run.precision == "fp32"  # a synchronous step equals a single-device step
    try:
        assert set_precision("tf32")["precision"] == "tf32"
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        assert set_precision("fp32") == {"precision": "fp32", "cudnn_benchmark": torch.backends.cudnn.benchmark}
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        set_precision("tf32")  # torch's own defaults: cuDNN's TF32 on, cuBLAS's off
        torch.backends.cuda.matmul.allow_tf32 = False


JOIN_ON_CPU = "to join on its CPU instead, set MAC_DEVICE=cpu"


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="a machine with MPS")
def test_a_machine_without_mps_is_refused_with_the_way_to_join_on_its_cpu():
    with pytest.raises(UserError, match="MPS is not available here: this is Linux, and MPS is Apple's") as refused:
        device_check.require("mps", fix=JOIN_ON_CPU)
    assert str(refused.value).endswith(JOIN_ON_CPU) and "\n" not in str(refused.value)


def test_an_mps_that_cannot_train_the_model_is_refused_with_the_same_way_out(monkeypatch):
    from hetbench import devices

    monkeypatch.setattr(devices, "mps_available", lambda: True)
    monkeypatch.setattr(device_check, "mps_available", lambda: True)

    def fails(device, precision):
        raise UserError(f"the model does not train on {device}: MPS backend out of memory")

    monkeypatch.setattr(device_check, "trained", fails)
    with pytest.raises(UserError, match=f"does not train on mps: MPS backend out of memory; {JOIN_ON_CPU}"):
        device_check.require("mps", fix=JOIN_ON_CPU)


def test_a_node_that_joined_on_its_cpu_trains_there_and_refuses_a_worker_configured_for_a_gpu(monkeypatch):
    from hetbench.devices import NODE_DEVICE_ENV, node_device

    monkeypatch.delenv(NODE_DEVICE_ENV, raising=False)
    assert node_device("mac", "cpu") == torch.device("cpu")  # not joined: as configured
    monkeypatch.setenv(NODE_DEVICE_ENV, "cpu")  # `hetbench worker` with MAC_DEVICE=cpu
    assert node_device("mac", "auto") == torch.device("cpu")  # auto takes the node's
    assert node_device("mac", "cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="worker 'mac' is configured for mps, but its machine joined .* on cpu"):
        node_device("mac", "mps")


@pytest.mark.parametrize(
    "kind, mocked, says",
    [
        (
            "cuda",
            ("cuda", "is_bf16_supported"),
            r"worker 'desk' cannot train in bf16 on cuda: cuda \(NVIDIA GeForce RTX 2080\) has no bfloat16",
        ),
        (
            "mps",
            ("backends.mps", "is_macos_or_newer"),
            "worker 'mac' cannot train in bf16 on mps: MPS has bfloat16 from",
        ),
    ],
)
def test_a_device_without_the_runs_precision_is_refused_in_one_sentence(monkeypatch, kind, mocked, says):
    """A Turing GPU (compute 7.5) and MPS before macOS 14 have no bfloat16; fp16 they have."""
    from hetbench import devices

    owner = torch.cuda if mocked[0] == "cuda" else torch.backends.mps
    monkeypatch.setattr(owner, mocked[1], lambda *args, **kwargs: False)
    monkeypatch.setattr(devices, "describe", lambda device: f"{device} (NVIDIA GeForce RTX 2080)")
    device, who = torch.device(kind), "worker 'desk'" if kind == "cuda" else "worker 'mac'"
    with pytest.raises(UserError, match=says) as refused:
        devices.check_precision(device, "bf16", who)
    assert "\n" not in str(refused.value) and "use precision fp16" in str(refused.value)
    devices.check_precision(device, "fp16", who)  # both have float16
    devices.check_precision(device, "fp32", who)
