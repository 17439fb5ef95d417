# Questions a Julia executor or analysis asks of a plan. Ids are the plan's 0-based ids.

"All `Compute` records, in schedule order."
computes(p::Plan) = Compute[r for r in p.records if r isa Compute]

"All `Move` records, in schedule order."
moves(p::Plan) = Move[r for r in p.records if r isa Move]

"All `Free` records, in schedule order."
frees(p::Plan) = Free[r for r in p.records if r isa Free]

"All `Recompute` records, in schedule order."
recomputes(p::Plan) = Recompute[r for r in p.records if r isa Recompute]

"""
    bytes_moved(plan; to=nothing) -> Int

Bytes copied between the tiers by the plan's `Move` records (each move counts the whole
tensor). `to=FAST` counts only copies into fast memory (prefetches), `to=SLOW` only copies
out (evictions and offloads). Needs the plan's tensor table.
"""
function bytes_moved(p::Plan; to::Union{Tier,Nothing}=nothing)
    total = 0
    for m in moves(p)
        (to === nothing || m.to == to) && (total += tensor_bytes(p, m.tensor))
    end
    return total
end

function _tensor(p::Plan, id::Integer)
    info = get(p.tensors, id, nothing)
    info === nothing && throw(ArgumentError(
        "tensor $id is not in the plan's tensor table ($(length(p.tensors)) tensors, " *
        "0-based ids); plans written by `autotm optimize` carry the table"))
    return info
end

function _kernel(p::Plan, id::Integer)
    info = get(p.kernels, id, nothing)
    info === nothing && throw(ArgumentError(
        "kernel $id is not in the plan's kernel table ($(length(p.kernels)) kernels, " *
        "0-based ids); plans written by `autotm optimize` carry the table"))
    return info
end

"Name of tensor `id` (0-based), from the plan's tensor table."
tensor_name(p::Plan, id::Integer) = _tensor(p, id).name

"Size in bytes of tensor `id` (0-based)."
tensor_bytes(p::Plan, id::Integer) = _tensor(p, id).bytes

"Name of kernel `id` (0-based), from the plan's kernel table."
kernel_name(p::Plan, id::Integer) = _kernel(p, id).name

"`(inputs, outputs)`: the 0-based tensor ids kernel `id` reads and writes (IO-slot order)."
kernel_io(p::Plan, id::Integer) = (k = _kernel(p, id); (k.inputs, k.outputs))

"Tiers where tensor `id` starts the iteration (empty for tensors that a kernel produces)."
initial_tiers(p::Plan, id::Integer) = get(p.initial, id, Tier[])

"The one-letter code of a tier in the JSON: `'F'` or `'S'`."
tier_code(t::Tier) = t == FAST ? 'F' : 'S'

"""
    arena_offset(plan, record, tensor) -> Union{Int,Nothing}

The planned offset of the fast copy of `tensor` (0-based id) that the record at 0-based
schedule position `record` makes (`-1`: the initial placement); `nothing` when the plan has no
arena or gives that copy none.
"""
function arena_offset(p::Plan, record::Integer, tensor::Integer)
    p.arena === nothing && return nothing
    for b in p.arena.buffers
        (b.record == record && b.tensor == tensor) && return b.offset
    end
    return nothing
end
