"""hetbench: data-parallel training strategies across unequal machines, measured.

Where math runs: devices.py. How gradients move: one module per strategy in the top-level
strategies/ (imported as hetbench.strategies; single.py is the baseline), sharing workload.py,
data.py, gradients.py, clock.py and results/records.py. Importing hetbench changes nothing in the
process: the CLI, connect() and the test suites set Ray's process defaults (use_ray_defaults).
"""
