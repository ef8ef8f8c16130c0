"""hetbench: data-parallel training strategies across unequal machines, measured.

Where math runs: devices.py. How gradients move: one module per strategy (single.py is
the baseline), sharing workload.py, data.py, gradients.py, clock.py and records.py.
"""

import os

# Ray fixes its auth mode when it is imported, and a `ray start` head turns token auth on by
# default: so every hetbench process (and every cluster it starts) uses token mode unless the
# user chose otherwise. The token itself is read when joining, so it can come later.
os.environ.setdefault("RAY_AUTH_MODE", "token")
# Nodes match at Python's minor release (3.11), not its patch: a Mac's Homebrew 3.11.y joins a
# desktop image's 3.11.x (one bytecode and pickle format per minor release). worker.py checks the
# minor release itself, with Ray, torch and hetbench's code.
os.environ.setdefault("RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL", "minor")
