"""The design card's top level: strategies/ beside hetbench/, installed and hashed as hetbench.strategies."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import hetbench.strategies
from hetbench.identity import code_hash, source_files
from hetbench.strategies import registry

ROOT = Path(__file__).resolve().parent.parent


def test_the_strategies_live_in_the_top_level_and_import_as_hetbench_strategies():
    assert Path(hetbench.strategies.__file__).resolve().parent == ROOT / "strategies"
    assert not (ROOT / "hetbench" / "strategies").exists()
    for name in registry.STRATEGIES:
        module = sys.modules[registry.load(name).__module__]
        assert Path(module.__file__).resolve().parent == ROOT / "strategies"


def test_the_code_hash_covers_every_strategy_file(tmp_path, monkeypatch):
    names = source_files()
    for path in (ROOT / "strategies").glob("*.py"):
        assert names[f"strategies/{path.name}"].resolve() == path.resolve()
    # another strategy module, the same package otherwise: another hash (a Mac running it is refused)
    before = code_hash()
    code_hash.cache_clear()
    monkeypatch.setitem(names, "strategies/extra.py", tmp_path / "extra.py")
    (tmp_path / "extra.py").write_text("X = 1\n")
    monkeypatch.setattr("hetbench.identity.source_files", lambda: names)
    try:
        assert code_hash() != before
    finally:
        code_hash.cache_clear()


def test_the_image_copies_every_source_folder_the_wheel_installs():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"hetbench", *setuptools["package-dir"].values()}
    copied = set(re.findall(r"^COPY (\S+) \1$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M))
    assert folders <= copied
    packages = {
        ".".join(d.relative_to(ROOT).parts) for d in (ROOT / "hetbench").rglob("*") if (d / "__init__.py").exists()
    }
    assert set(setuptools["packages"]) == {"hetbench", "hetbench.strategies", *packages}  # the wheel leaves none out
