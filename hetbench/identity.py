"""Which code this is: a hash of the package's own source files, the same on every machine that runs
the same checkout or image, whatever its version string or git state (an image has no .git)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.util import find_spec
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def source_files() -> dict[str, Path]:
    """Every source file, by its name inside the installed package: a checkout keeps the strategies at
    the top level (strategies/), an installed wheel inside hetbench/; both name them strategies/...
    (find_spec locates them without running them)."""
    files = {p.relative_to(PACKAGE).as_posix(): p for p in PACKAGE.rglob("*.py")}
    strategies = Path(find_spec("hetbench.strategies").origin).parent
    files.update({f"strategies/{p.relative_to(strategies).as_posix()}": p for p in strategies.rglob("*.py")})
    return files


@cache
def code_hash() -> str:
    digest = hashlib.sha256()
    for name, path in sorted(source_files().items()):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
