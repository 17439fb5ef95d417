# Driving a user's executor through the schedule.
#
# Two ways to plug an executor in: pass callbacks (`compute=`, `move=`, `free=`,
# `recompute=`, `fill=`), or add methods to `on_compute!`, `on_move!`, `on_free!`,
# `on_recompute!`, `on_fill!` for
# the executor's type. The callbacks
# default to those functions, so both can be mixed.

"""
    RecordError(index, record, cause)

Thrown by [`apply_plan!`](@ref) when a handler fails: `index` is the record's 1-based
position in `plan.records`, `cause` the original exception.
"""
struct RecordError <: Exception
    index::Int
    record::Record
    cause::Any
end

function Base.showerror(io::IO, e::RecordError)
    print(io, "RecordError: record ", e.index, " (", e.record, ") failed: ")
    showerror(io, e.cause)
end

_no_handler(name, ex, R) = throw(ArgumentError(
    "no $name handler for an executor of type $(typeof(ex)): pass `$name=(executor, record) -> ...` " *
    "to apply_plan!, or define AutoTMBridge.on_$(name)!(::$(typeof(ex)), ::$R)"))

"Run a `Compute` record on `executor`; add a method for your executor type."
on_compute!(executor, record::Compute) = _no_handler("compute", executor, Compute)

"Run a `Move` record on `executor`; add a method for your executor type."
on_move!(executor, record::Move) = _no_handler("move", executor, Move)

"Run a `Free` record on `executor`; add a method for your executor type."
on_free!(executor, record::Free) = _no_handler("free", executor, Free)

"Run a `Recompute` record on `executor` (re-run the kernel, keep `record.outputs`)."
on_recompute!(executor, record::Recompute) = _no_handler("recompute", executor, Recompute)

"Run a `Fill` record on `executor` (write `record.value` into a new fast copy of the tensor)."
on_fill!(executor, record::Fill) = _no_handler("fill", executor, Fill)

"""
    apply_plan!(executor, plan; compute=on_compute!, move=on_move!, free=on_free!,
                recompute=on_recompute!, fill=on_fill!) -> executor

Walk `plan`'s records in order and call `compute(executor, record)`,
`move(executor, record)`, `free(executor, record)`, `recompute(executor, record)` or
`fill(executor, record)` for each. A handler that throws stops
the walk with a [`RecordError`](@ref) naming the record. Returns `executor`.

Async moves (`record.mode === :async`) come right before the `Compute` of the kernel they
overlap (`record.overlaps`); an executor that runs copies on their own stream starts the
copy in `move` and waits for it before the next use of the tensor.
"""
function apply_plan!(executor, plan::Plan; compute=on_compute!, move=on_move!, free=on_free!,
                     recompute=on_recompute!, fill=on_fill!)
    handlers = (compute, move, free, recompute, fill)
    for (i, record) in enumerate(plan.records)
        try
            _dispatch(executor, record, handlers...)
        catch err
            err isa InterruptException && rethrow()
            throw(RecordError(i, record, err))
        end
    end
    return executor
end

_dispatch(ex, r::Compute, compute, move, free, recompute, fill) = compute(ex, r)
_dispatch(ex, r::Move, compute, move, free, recompute, fill) = move(ex, r)
_dispatch(ex, r::Free, compute, move, free, recompute, fill) = free(ex, r)
_dispatch(ex, r::Recompute, compute, move, free, recompute, fill) = recompute(ex, r)
_dispatch(ex, r::Fill, compute, move, free, recompute, fill) = fill(ex, r)
