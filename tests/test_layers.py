"""hetbench's imports run down its layers, and no module imports itself back in a circle.

Imports inside functions count: a lazy import is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
import pkgutil

import hetbench

# Bottom to top; a module may import from its own layer or any below it.
LAYERS = [
    {"errors", "inputs", "identity", "cores", "devices", "clock", "progress", "step_timing", "step_rate"},
    {"gradients", "partial_step", "balance", "train_state", "optimizer"},
    {"config"},
    {"data", "metric"},
    {"workload", "workloads", "device_check", "training"},
    {"transport", "cluster"},
    {"strategies", "floor", "standalone"},
    {"scenarios"},
    {"plan"},
    {"results"},
    {"race"},
    {"row_run"},
    {"planning"},
    {"runner"},
    {"cli", "__main__"},
]


def modules() -> dict[str, str]:
    """Every hetbench module's name -> its source file (the strategies too, wherever they live)."""
    found = {}
    for info in pkgutil.walk_packages(hetbench.__path__, "hetbench."):
        spec = info.module_finder.find_spec(info.name.rsplit(".", 1)[-1])
        found[info.name] = spec.origin
    return found


def imports(name: str, path: str, known: set[str]) -> set[str]:
    """The hetbench modules `name` imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, names in enumerate(LAYERS) if part in names)


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items() if name != "hetbench"}


def test_every_module_has_a_layer():
    assert [m for m in graph() if not any(m.split(".")[1] in names for names in LAYERS)] == []


def test_no_import_runs_back_up_the_layers():
    upward = [f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer(b) > layer(a)]
    assert upward == []


def test_no_module_imports_itself_back_in_a_circle():
    edges = graph()

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges.get(start, ()):
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    assert sorted(m for m in edges if reaches(m, m, set())) == []


# The rooms that take a whole Config: where it is loaded, and planned into rows and run. A row's
# strategy, its workers' roles and a worker timed alone take a Job (run, workers, cluster and the
# strategy's own settings); every other room takes the sections it needs (the cluster its
# ClusterConfig and the workers, the data and the loop the RunConfig, the floor its FloorConfig) or
# the config as records keep it (a dict).
# plan: every row, as the runner; race, row_run and planning: the runner's named parts
TAKE_THE_WHOLE_CONFIG = {"config", "cli", "runner", "race", "row_run", "planning", "scenarios", "plan"}


def test_only_the_rooms_that_run_a_row_take_the_whole_config():
    takers = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.module == "hetbench.config":
                if "Config" in {alias.name for alias in node.names}:
                    takers.add(name.removeprefix("hetbench."))
    room = {m: next((r for r in TAKE_THE_WHOLE_CONFIG if m == r or m.startswith(r + ".")), None) for m in takers}
    assert sorted(m for m, r in room.items() if r is None) == []
