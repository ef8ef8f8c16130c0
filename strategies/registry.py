"""Strategy names -> implementations, imported lazily so a missing optional stack never breaks the CLI."""

from __future__ import annotations

import importlib

from hetbench.errors import UserError
from hetbench.strategies.base import Strategy

STRATEGIES = {  # name -> "module:Class"; one line per strategy
    "single": "hetbench.strategies.single:Single",
    "ray-ps": "hetbench.strategies.ray_ps:RayParameterServer",
    "ray-ps-async": "hetbench.strategies.ray_ps_async:RayParameterServerAsync",
    "ray-train-gloo": "hetbench.strategies.ray_train_gloo:RayTrainGloo",
    "dask-sync": "hetbench.strategies.dask_sync:DaskSync",
    "ray-localsgd": "hetbench.strategies.ray_localsgd:RayLocalSGD",
    "torch-ddp": "hetbench.strategies.torch_ddp:TorchDDP",
}
BASELINE = "single"


def check_names(names: list[str]) -> None:
    for name in names:
        if name not in STRATEGIES:
            raise UserError(f"unknown strategy '{name}'; available: {', '.join(STRATEGIES)}")


def load(name: str) -> type[Strategy]:
    """The strategy class; ImportError says why it is unavailable here."""
    check_names([name])
    module_name, class_name = STRATEGIES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise ImportError(f"strategies/{module_name.rsplit('.', 1)[-1]}.py is not implemented yet") from None
        raise ImportError(f"needs the '{e.name}' package, which is not installed") from None
    return getattr(module, class_name)


def availability() -> dict[str, str | None]:
    """name -> None if usable here, else the reason it is not."""
    reasons: dict[str, str | None] = {}
    for name in STRATEGIES:
        try:
            load(name)
            reasons[name] = None
        except ImportError as e:
            reasons[name] = str(e)
    return reasons


def options(name: str) -> dict[str, tuple]:
    """A registered strategy's own settings (Strategy.options), or none where it is unavailable here."""
    if name not in STRATEGIES:
        return {}
    try:
        return load(name).options
    except ImportError:
        return {}
