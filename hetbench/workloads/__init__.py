"""hetbench's built-in workloads (workload.BUILT_IN): each module's `build(run, announce)` returns its Workload."""
