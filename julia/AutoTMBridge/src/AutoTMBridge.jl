"""
    AutoTMBridge

Read the tensor-placement plans that `autotm optimize` (the Python package `autotm_py`)
writes, and walk them from Julia: iterate over the schedule, query it, or apply it to your
own executor through callbacks.

```julia
using AutoTMBridge
plan = read_plan("plan.json")
for record in plan            # Compute, Move, Free, Recompute and Fill records, in order
    println(record)
end
apply_plan!(my_executor, plan; compute = run_kernel!, move = copy_tensor!, free = drop!,
            recompute = rerun_kernel!)
```

Ids are kept exactly as the plan stores them: **0-based** tensor and kernel ids, the ids of
the Python `TensorGraph`. Record positions (`plan[i]`, error messages) are Julia's 1-based
indices into `plan.records`.
"""
module AutoTMBridge

import JSON

export Tier, FAST, SLOW, Record, Compute, Move, Free, Recompute, Fill, SolverStats, PlanHeader,
    ModelOptions, RunMode, CostsIdentity, TensorInfo, ArenaBuffer, ArenaLayout, arena_offset,
    KernelInfo, Plan, PlanError, RecordError, FORMAT_VERSION, READABLE_VERSIONS,
    read_plan, parse_plan, plan_from_dict,
    computes, moves, frees, recomputes, bytes_moved, tensor_name, tensor_bytes, kernel_name,
    kernel_io, initial_tiers, tier_code,
    apply_plan!, on_compute!, on_move!, on_free!, on_recompute!, on_fill!

include("types.jl")
include("read.jl")
include("queries.jl")
include("apply.jl")

end # module
