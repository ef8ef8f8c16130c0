"""Your own models: `--set workload=workloads.NAME:build` (README.md here). A package, not a bare
folder, so that no other `workloads` module on the path (benchmarks/workloads.py, run as a script)
takes its name."""
