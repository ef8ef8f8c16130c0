"""hetbench's built-in workloads, one module each (config.BUILT_IN_WORKLOADS names them, with the run
settings each trains with): its `build(run, announce)` returns its Workload."""

from hetbench.config import BUILT_IN_WORKLOADS
from hetbench.workload import built_in_module

# name -> its module; a user's workload is a `module:function` instead
BUILT_IN = {name: built_in_module(name) for name in BUILT_IN_WORKLOADS}
