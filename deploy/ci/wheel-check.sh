#!/usr/bin/env bash
# The wheel as a user's machine or the image installs it: built from this checkout, installed
# outside it, and every registered strategy imported from there (the checkout keeps them in the top
# level strategies/, the wheel inside hetbench/). Its code hash must equal the checkout's, or a Mac
# running the checkout would be refused at join by a desk running the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-$PWD/.venv/bin/python}
CHECKOUT=$PWD
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# From a copy of the working tree's files (tracked or new, not ignored): no build/ left from before
# can slip a deleted module into the wheel, and none is left behind.
mkdir "$OUT/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c --ignore-failed-read 2>/dev/null | tar -x -C "$OUT/src"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/dist" "$OUT/src"
"$PY" -m pip install -q --no-deps --target "$OUT/site" "$OUT"/dist/hetbench-*.whl
cd "$OUT"
PYTHONPATH="$OUT/site" "$PY" - "$OUT/site" "$CHECKOUT" <<'PY'
import subprocess, sys
from pathlib import Path

site, checkout = Path(sys.argv[1]), sys.argv[2]
import hetbench
from hetbench.identity import code_hash
from hetbench.strategies import registry

def inside(module) -> bool:
    return Path(module.__file__).resolve().is_relative_to(site)

assert inside(hetbench), f"hetbench imported from {hetbench.__file__}, not the wheel"
for name in registry.STRATEGIES:
    module = sys.modules[registry.load(name).__module__]
    assert inside(module), f"{name} imported from {module.__file__}, not the wheel"
    print(f"ok: {name} from {Path(module.__file__).relative_to(site)}")
ours = subprocess.run([sys.executable, "-c", "from hetbench.identity import code_hash; print(code_hash())"],
                      cwd=checkout, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
assert ours.stdout.strip() == code_hash(), f"code hash: wheel {code_hash()}, checkout {ours.stdout.strip()}"
print(f"ok: the wheel's code hash {code_hash()} is the checkout's")
PY
