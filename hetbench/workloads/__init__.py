"""hetbench's built-in workloads, one module each (config.BUILT_IN_WORKLOADS names them, with the run
settings each trains with): its `build(run, announce)` returns its Workload."""

from hetbench.config import BUILT_IN_WORKLOADS

# name -> its module; a user's workload is a `module:function` instead
BUILT_IN = {name: f"hetbench.workloads.{name.replace('-', '_')}" for name in BUILT_IN_WORKLOADS}
