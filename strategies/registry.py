"""Strategy names -> implementations, imported lazily so a missing optional stack never breaks the CLI."""

from __future__ import annotations

import importlib
import re

from hetbench.errors import UserError
from hetbench.strategies.base import Strategy

STRATEGIES: dict[str, str] = {}  # name -> "module:Class", in the order runs and tables list them
TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def register(name: str, target: str) -> None:
    """Add a strategy: `name` (what configs say) -> "module:Class". A name taken twice, or a target
    that is not module:Class, is a mistake in the code: refused at once."""
    if name in STRATEGIES:
        raise ValueError(f"strategy '{name}' is registered twice ({STRATEGIES[name]} and {target})")
    if not TARGET.match(target):
        raise ValueError(f"strategy '{name}': '{target}' is not module:Class")
    STRATEGIES[name] = target


register("single", "hetbench.strategies.single:Single")
register("ray-ps", "hetbench.strategies.ray_ps:RayParameterServer")
register("ray-ps-async", "hetbench.strategies.ray_ps_async:RayParameterServerAsync")
register("ray-train", "hetbench.strategies.ray_train:RayTrain")
register("dask-sync", "hetbench.strategies.dask_sync:DaskSync")
register("ray-localsgd", "hetbench.strategies.ray_localsgd:RayLocalSGD")
register("torch-ddp", "hetbench.strategies.torch_ddp:TorchDDP")
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
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"strategy '{name}': {STRATEGIES[name]} is not a Strategy subclass")
    if cls.name != name:
        raise TypeError(f"strategy '{name}': {STRATEGIES[name]} calls itself '{cls.name}'")
    return cls


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


def declared() -> dict[str, type[Strategy] | None]:
    """Every registered strategy's class, or None where it is unavailable here: what config.py reads
    their own settings (Strategy.options) by."""
    classes: dict[str, type[Strategy] | None] = {}
    for name in STRATEGIES:
        try:
            classes[name] = load(name)
        except ImportError:
            classes[name] = None
    return classes
