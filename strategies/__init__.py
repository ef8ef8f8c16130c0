"""hetbench: data-parallel training strategies across unequal machines, measured.

Where math runs: devices.py. How gradients move: one module per strategy (single.py is
the baseline), sharing workload.py, data.py, gradients.py, clock.py and records.py.
"""
