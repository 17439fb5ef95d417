# The plan as Julia values. Field names follow the JSON document
# (autotm_py/schemas/plan.schema.json), so the Python docs apply unchanged.

"The plan format version this package writes its expectations for (`format_version` in the JSON)."
const FORMAT_VERSION = 3

"The plan format versions this package reads: version 2 recorded the run mode as `graph` and
`config`'s `arena`, `placed` and `scratch` (read into a `RunMode`)."
const READABLE_VERSIONS = (2, 3)

"""
    Tier

Where a copy of a tensor lives: `FAST` (GPU memory, or DRAM in host mode) or `SLOW`
(pinned host memory, Optane PMM, CXL memory).
"""
@enum Tier FAST SLOW

"One step of the schedule: a [`Compute`](@ref), [`Move`](@ref), [`Free`](@ref),
[`Recompute`](@ref) or [`Fill`](@ref)."
abstract type Record end

"""
    Compute(kernel, placement)

Run kernel `kernel` (0-based id). `placement[j]` is the tier of the kernel's j-th IO slot,
inputs first, then outputs; every input is resident there and each output is created there.
"""
struct Compute <: Record
    kernel::Int
    placement::Vector{Tier}
end

"""
    Move(tensor, to, mode, overlaps)

Copy tensor `tensor` (0-based id) into tier `to` from the other tier; afterwards it is
resident in both. `mode` is `:sync` (compute waits) or `:async` (the copy starts with kernel
`overlaps` and runs beside it; the next reader of the copy waits for it).
"""
struct Move <: Record
    tensor::Int
    to::Tier
    mode::Symbol
    overlaps::Union{Int,Nothing}
end

"""
    Free(tensor, tier)

Drop the copy of tensor `tensor` (0-based id) in `tier`.
"""
struct Free <: Record
    tensor::Int
    tier::Tier
end

"""
    Recompute(kernel, outputs, before)

Re-run forward kernel `kernel` (0-based id) on the compute stream, right before kernel `before`
(the next `Compute`), to regenerate `outputs` (0-based tensor ids, some of the kernel's
outputs, absent from both tiers since a `Free` dropped them) in fast memory. Every input of
the kernel is in fast memory; outputs not listed are made and dropped at once. Plans never
re-run kernels with random outputs.
"""
struct Recompute <: Record
    kernel::Int
    outputs::Vector{Int}
    before::Int
end

"""
    Fill(tensor, value)

Make a fast copy of tensor `tensor` (0-based id) whose every element is `value`, with a fill
kernel on the compute stream before the next `Compute`: a tensor that a value profile found
all zero or one constant, which the plan drops instead of writing out and fills instead of
reading back. The tensor need not be in any tier.
"""
struct Fill <: Record
    tensor::Int
    value::Float64
end

# Compute and Recompute hold Vectors, so the default `==` (identity) would make equal records
# unequal.
Base.:(==)(a::Compute, b::Compute) = a.kernel == b.kernel && a.placement == b.placement
Base.hash(a::Compute, h::UInt) = hash(a.placement, hash(a.kernel, hash(:Compute, h)))
Base.:(==)(a::Recompute, b::Recompute) =
    a.kernel == b.kernel && a.outputs == b.outputs && a.before == b.before
Base.hash(a::Recompute, h::UInt) =
    hash(a.before, hash(a.outputs, hash(a.kernel, hash(:Recompute, h))))

"How the plan was found (zeros and `\"none\"` for plans of baselines that use no solver)."
struct SolverStats
    solver::String
    status::String
    objective_s::Union{Float64,Nothing}
    gap::Union{Float64,Nothing}
    variables::Int
    constraints::Int
    build_s::Float64
    solve_s::Float64
    time_limit_s::Union{Float64,Nothing}
    hit_time_limit::Bool
end

"""How the plan runs and was priced for (`autotm_py.options.RunMode`): every fast copy at a
planned offset in one arena (`arena`), kernels allocating their outputs at their slots
(`placed`), where kernels' scratch lives (`scratch`: \"windows\" or \"region\"), and the
iteration replayed as a CUDA graph (`replay`)."""
struct RunMode
    arena::Bool
    placed::Bool
    scratch::String
    replay::Bool
end

"How the planned graph was loaded: the options that rebuild it (`--batch`, `--dim`, ...)."
struct ModelOptions
    batch::Union{Int,Nothing}
    dims::Dict{String,Any}
    training::Bool
    optimizer::Union{String,Nothing}
    fuse::Bool
    loss::Union{String,Nothing}
    loss_chunks::Int  # --loss-chunks (1: the plain loss; absent in older plans)
    channels_last::Bool  # --channels-last (false: row-major; absent in older plans)
    precision::String  # --precision: fp32 or bf16 (fp32: absent in older plans)
    split_conv_grads::Vector{String}  # --split-conv-grads: the fused convolution backward
    # kernels split, by name (none: absent in older plans)
    host_updates::Bool  # --optimizer-on host: the updates run on the host (false: absent in
    # older plans)
    host_share::Union{Float64,Nothing}  # --optimizer-on split: the host's share of the
    # parameters (nothing: all of them, or absent in older plans)
    updates_early::Bool  # --update-order: the optimizer updates run just after their
    # gradients (false: after the backward pass, or absent in older plans)
end

"""The kernel costs the plan was solved with: `digest` (a hash over every kernel's time,
device time, workspace and estimated flag), how many kernels, how many of their times were
roofline estimates or scaled from another batch, and the sum of the kernel times."""
struct CostsIdentity
    digest::String
    kernels::Int
    estimated::Int
    scaled::Int
    total_s::Float64
end

"The plan's header: which model and memory system it is for, and how it was made."
struct PlanHeader
    format_version::Int
    model_hash::String
    model_name::String
    strategy::String
    budget_bytes::Union{Int,Nothing}
    memory_system::Dict{String,Any}
    predicted_time_s::Union{Float64,Nothing}
    solver::SolverStats
    graph_summary::Dict{String,Any}
    counts::Dict{String,Any}
    config::Dict{String,Any}
    notes::Vector{String}
    device::String
    pin_weights::Bool
    headroom::Float64
    model::Union{ModelOptions,Nothing}
    run::RunMode
    costs::Union{CostsIdentity,Nothing}
    gpu::Union{String,Nothing}  # the GPU whose profiles priced it (absent in older plans)
    source::Union{String,Nothing}  # the model it was made for: a file's path or a zoo name
end

"A row of the plan's tensor table: 0-based id, name, size in bytes, role (e.g. `\"weight\"`)."
struct TensorInfo
    id::Int
    name::String
    bytes::Int
    role::String
end

"A row of the plan's kernel table: 0-based id, name, op type, and its input/output tensor ids."
struct KernelInfo
    id::Int
    name::String
    op_type::String
    inputs::Vector{Int}
    outputs::Vector{Int}
end

"""
    ArenaBuffer(record, tensor, offset, nbytes)

One fast-memory buffer at a planned offset: made by the record at 0-based position `record`
of the schedule (`-1`: the initial placement), holding tensor `tensor` (`-1`: the scratch of
that compute record), `nbytes` long from byte `offset` of the arena.
"""
struct ArenaBuffer
    record::Int
    tensor::Int
    offset::Int
    nbytes::Int
end

"""
    ArenaLayout

Where the plan's fast-memory buffers live in one arena of `nbytes`: tensors below
`scratch_offset`, kernel scratch above it (or, with scratch windows, the default for arena plans
since 2026-11-28, a kernel's scratch of 1 MiB or more below it: a window among the tensors, used
only while that kernel runs); every offset a multiple of `alignment`.
"""
struct ArenaLayout
    nbytes::Int
    scratch_offset::Int
    alignment::Int
    buffers::Vector{ArenaBuffer}
end

Base.:(==)(a::ArenaLayout, b::ArenaLayout) =
    (a.nbytes, a.scratch_offset, a.alignment, a.buffers) ==
    (b.nbytes, b.scratch_offset, b.alignment, b.buffers)

"""
    Plan

A parsed plan: `header`, `initial` (tensor id => tiers where a tensor without a producer
starts), `records` (the schedule), the `tensors`/`kernels` name tables (empty when the plan
was written without them) and `arena` (planned offsets, `nothing` when the plan has none).
Iterating a `Plan` yields its records in order.
"""
struct Plan
    header::PlanHeader
    initial::Dict{Int,Vector{Tier}}
    records::Vector{Record}
    tensors::Dict{Int,TensorInfo}
    kernels::Dict{Int,KernelInfo}
    arena::Union{ArenaLayout,Nothing}
end

Plan(header, initial, records, tensors, kernels) =
    Plan(header, initial, records, tensors, kernels, nothing)

# ---- iteration over the schedule --------------------------------------------------------
Base.iterate(p::Plan, i::Int=1) = i > length(p.records) ? nothing : (p.records[i], i + 1)
Base.length(p::Plan) = length(p.records)
Base.eltype(::Type{Plan}) = Record
Base.getindex(p::Plan, i::Integer) = p.records[i]
Base.firstindex(p::Plan) = firstindex(p.records)
Base.lastindex(p::Plan) = lastindex(p.records)
Base.keys(p::Plan) = keys(p.records)

function Base.show(io::IO, p::Plan)
    h = p.header
    print(io, "Plan(", repr(h.model_name), ", strategy=", h.strategy, ", ",
        length(p.records), " records)")
end
