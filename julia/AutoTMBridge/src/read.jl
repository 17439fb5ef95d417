# Reading the plan JSON (schema: autotm_py/schemas/plan.schema.json).
#
# Every access to a JSON object goes through `_req(conv, obj, "key", ctx)` (a required field)
# or `_opt(conv, obj, "key", default, ctx)` (an optional one), always with the key as a string
# literal: the Python test suite parses this file and checks that these keys are exactly the
# fields the schema names (and its required fields exactly the `_req` keys).

"""
    PlanError(msg)

A plan that cannot be read: not JSON, not an autotm plan, another format version, or a field
of the wrong kind. The message names the file, the field and the fix.
"""
struct PlanError <: Exception
    msg::String
end

Base.showerror(io::IO, e::PlanError) = print(io, "PlanError: ", e.msg)

const _FIX = "write plans with `autotm optimize MODEL -o plan.json`"
const _TIER_BY_CODE = Dict('F' => FAST, 'S' => SLOW)
const _TIER_BY_NAME = Dict("fast" => FAST, "slow" => SLOW)
const _MODES = Dict("sync" => :sync, "async" => :async)

"""
    read_plan(source) -> Plan

Read a plan from a file path, from JSON text (a string that starts with `{`), or from an `IO`.
Throws a [`PlanError`](@ref) that names the problem when the plan cannot be read.
"""
function read_plan(source::AbstractString)
    startswith(lstrip(source), "{") && return parse_plan(source)
    isfile(source) || throw(PlanError("no plan file at $(repr(source)); $_FIX"))
    return parse_plan(read(source, String); origin=String(source))
end

read_plan(io::IO) = parse_plan(read(io, String))

"""
    parse_plan(text; origin="plan") -> Plan

Parse plan JSON held in memory (this is how the Python bridge hands plans over).
"""
function parse_plan(text::AbstractString; origin::AbstractString="plan")
    data = try
        # Python's json writes NaN/Infinity for non-finite floats (e.g. an unknown gap)
        JSON.parse(text; dicttype=Dict{String,Any}, allownan=true)
    catch err
        err isa InterruptException && rethrow()
        why = first(split(sprint(showerror, err), '\n'))
        throw(PlanError("$origin: not valid JSON ($why); was the file truncated?"))
    end
    data isa AbstractDict ||
        throw(PlanError("$origin: not an autotm plan (the JSON is not an object); $_FIX"))
    return plan_from_dict(data; origin=origin)
end

"""
    plan_from_dict(data; origin="plan") -> Plan

Build a `Plan` from an already parsed JSON object (string keys).
"""
function plan_from_dict(data::AbstractDict; origin::AbstractString="plan")
    try
        return _plan(data)
    catch err
        err isa PlanError && throw(PlanError("$origin: $(err.msg)"))
        rethrow()
    end
end

function _plan(d)
    fmt = _req(_any, d, "format", "")
    fmt == "autotm-plan" || throw(PlanError(
        "not an autotm plan (\"format\" is $(repr(fmt)), expected \"autotm-plan\"); $_FIX"))
    version = _req(_any, d, "format_version", "")
    version in READABLE_VERSIONS || throw(PlanError(
        "plan format version $(repr(version)) is not supported (AutoTMBridge reads versions " *
        "$(join(READABLE_VERSIONS, ", "))); re-run `autotm optimize` or update AutoTMBridge"))
    header = _req(_header, d, "header", "")
    initial = _req(_initial, d, "initial", "")
    records = _req(_records, d, "records", "")
    tensors, kernels = _req(_names, d, "names", "")
    arena = _opt(_arena, d, "arena", nothing, "")
    return Plan(header, initial, records, tensors, kernels, arena)
end

# ---- field access ------------------------------------------------------------------------
_at(ctx, key) = isempty(ctx) ? String(key) : "$ctx.$key"
_fail(ctx, text) = throw(PlanError(isempty(ctx) ? text : "$ctx: $text"))

function _req(conv, d::AbstractDict, key::String, ctx::AbstractString)
    haskey(d, key) || _fail(ctx, "missing field \"$key\"; $_FIX")
    return conv(d[key], _at(ctx, key))
end

_req(conv, d, key::String, ctx::AbstractString) = _bad(d, "an object", ctx)

function _opt(conv, d::AbstractDict, key::String, default, ctx::AbstractString)
    value = get(d, key, nothing)
    return value === nothing ? default : conv(value, _at(ctx, key))
end

_opt(conv, d, key::String, default, ctx::AbstractString) = _bad(d, "an object", ctx)

# ---- value conversions: each takes (json value, ctx) -------------------------------------
function _kind(x)
    x === nothing && return "null"
    x isa AbstractString && return "a string"
    x isa AbstractVector && return "an array"
    x isa Bool && return "a boolean"
    x isa Number && return "a number"
    return "an object"
end

function _bad(x, what, ctx)
    shown = repr(x)
    length(shown) > 40 && (shown = first(shown, 40) * "...")
    _fail(ctx, "expected $what, got $(_kind(x)) $shown")
end

_any(x, ctx) = x
_int(x::Integer, ctx) = Int(x)
_int(x::Bool, ctx) = _bad(x, "an integer", ctx)
_int(x::AbstractFloat, ctx) = isinteger(x) ? Int(x) : _bad(x, "an integer", ctx)
_int(x, ctx) = _bad(x, "an integer", ctx)
_id(x, ctx) = (n = _int(x, ctx); n >= 0 ? n : _bad(x, "a 0-based id", ctx))
_optint(x::Nothing, ctx) = nothing
_optint(x, ctx) = _int(x, ctx)
_float(x::Real, ctx) = Float64(x)
_float(x::Bool, ctx) = _bad(x, "a number", ctx)
_float(x, ctx) = _bad(x, "a number", ctx)
_optfloat(x::Nothing, ctx) = nothing
_optfloat(x, ctx) = _float(x, ctx)
_str(x::AbstractString, ctx) = String(x)
_str(x, ctx) = _bad(x, "a string", ctx)
_optstr(x::Nothing, ctx) = nothing
_optstr(x, ctx) = _str(x, ctx)
_bool(x::Bool, ctx) = x
_bool(x, ctx) = _bad(x, "true or false", ctx)
_array(x::AbstractVector, ctx) = x
_array(x, ctx) = _bad(x, "an array", ctx)
_object(x::AbstractDict, ctx) = Dict{String,Any}(String(k) => v for (k, v) in x)
_object(x, ctx) = _bad(x, "an object", ctx)
_strings(x, ctx) = String[_str(s, "$ctx[$i]") for (i, s) in enumerate(_array(x, ctx))]
_ids(x, ctx) = Int[_id(v, "$ctx[$i]") for (i, v) in enumerate(_array(x, ctx))]

function _row(x, n, ctx)
    row = _array(x, ctx)
    length(row) == n || _fail(ctx, "expected $n items, got $(length(row))")
    return row
end

function _tier_code(c::AbstractChar, ctx)
    haskey(_TIER_BY_CODE, c) || _fail(ctx, "unknown tier code '$c' (expected F or S)")
    return _TIER_BY_CODE[c]
end

_tier_codes(x, ctx) = Tier[_tier_code(c, ctx) for c in _str(x, ctx)]

function _tier_name(x, ctx)
    name = _str(x, ctx)
    haskey(_TIER_BY_NAME, name) || _fail(ctx, "unknown tier $(repr(name)) (expected fast or slow)")
    return _TIER_BY_NAME[name]
end

function _mode(x, ctx)
    name = _str(x, ctx)
    haskey(_MODES, name) || _fail(ctx, "unknown move mode $(repr(name)) (expected sync or async)")
    return _MODES[name]
end

# ---- sections ----------------------------------------------------------------------------
function _solver(x, ctx)
    return SolverStats(
        _req(_str, x, "solver", ctx),
        _req(_str, x, "status", ctx),
        _req(_optfloat, x, "objective_s", ctx),
        _req(_optfloat, x, "gap", ctx),
        _req(_int, x, "variables", ctx),
        _req(_int, x, "constraints", ctx),
        _req(_float, x, "build_s", ctx),
        _req(_float, x, "solve_s", ctx),
        _req(_optfloat, x, "time_limit_s", ctx),
        _req(_bool, x, "hit_time_limit", ctx),
    )
end

function _header(x, ctx)
    version = _req(_int, x, "format_version", ctx)
    return PlanHeader(
        version,
        _req(_str, x, "model_hash", ctx),
        _req(_str, x, "model_name", ctx),
        _req(_str, x, "strategy", ctx),
        _req(_optint, x, "budget_bytes", ctx),
        _req(_object, x, "memory_system", ctx),
        _req(_optfloat, x, "predicted_time_s", ctx),
        _req(_solver, x, "solver", ctx),
        _req(_object, x, "graph_summary", ctx),
        _req(_object, x, "counts", ctx),
        _req(_object, x, "config", ctx),
        _req(_strings, x, "notes", ctx),
        _req(_str, x, "device", ctx),
        _req(_bool, x, "pin_weights", ctx),
        _req(_float, x, "headroom", ctx),
        _req(_optmodel, x, "model", ctx),
        version >= 3 ? _req(_runmode, x, "run", ctx) : _old_runmode(x, ctx),
        _req(_optcosts, x, "costs", ctx),
        _opt(_optstr, x, "gpu", nothing, ctx),
        _opt(_optstr, x, "source", nothing, ctx),
    )
end

_optcosts(x::Nothing, ctx) = nothing
function _optcosts(x, ctx)
    return CostsIdentity(
        _req(_str, x, "digest", ctx),
        _req(_int, x, "kernels", ctx),
        _req(_int, x, "estimated", ctx),
        _req(_int, x, "scaled", ctx),
        _req(_float, x, "total_s", ctx),
    )
end

function _runmode(x, ctx)
    return RunMode(
        _req(_bool, x, "arena", ctx),
        _req(_bool, x, "placed", ctx),
        _req(_str, x, "scratch", ctx),
        _req(_bool, x, "replay", ctx),
    )
end

# A version 2 header: `graph` (absent: false) and the arena, placed and scratch of `config`.
function _old_runmode(x, ctx)
    config = _req(_object, x, "config", ctx)
    at = _at(ctx, "config")
    arena = _opt(_bool, config, "arena", false, at)
    placed = _opt(_bool, config, "placed", false, at)
    scratch = arena && placed ? _opt(_str, config, "scratch", "region", at) : "region"
    return RunMode(arena, placed, scratch, _opt(_bool, x, "graph", false, ctx))
end

_optmodel(x::Nothing, ctx) = nothing
function _optmodel(x, ctx)
    return ModelOptions(
        _req(_optint, x, "batch", ctx),
        _req(_object, x, "dims", ctx),
        _req(_bool, x, "training", ctx),
        _req(_optstr, x, "optimizer", ctx),
        _req(_bool, x, "fuse", ctx),
        _req(_optstr, x, "loss", ctx),
        _opt(_int, x, "loss_chunks", 1, ctx),
        _opt(_bool, x, "channels_last", false, ctx),
        _opt(_str, x, "precision", "fp32", ctx),
        _opt(_strings, x, "split_conv_grads", String[], ctx),
        _opt(_bool, x, "host_updates", false, ctx),
        _opt(_optfloat, x, "host_share", nothing, ctx),
        _opt(_bool, x, "updates_early", false, ctx),
    )
end

function _initial(x, ctx)
    out = Dict{Int,Vector{Tier}}()
    for (key, code) in _object(x, ctx)
        id = tryparse(Int, key)
        (id === nothing || id < 0) && _fail(ctx, "key $(repr(key)) is not a 0-based tensor id")
        out[id] = _tier_codes(code, "$ctx[$(repr(key))]")
    end
    return out
end

_records(x, ctx) = Record[_record(r, "$ctx[$i]") for (i, r) in enumerate(_array(x, ctx))]

function _record(x, ctx)
    op = _req(_str, x, "op", ctx)
    op == "compute" && return _compute(x, ctx)
    op == "move" && return _move(x, ctx)
    op == "free" && return _free(x, ctx)
    op == "recompute" && return _recompute(x, ctx)
    op == "fill" && return _fill(x, ctx)
    _fail(ctx, "unknown record op $(repr(op)) (expected compute, move, free, recompute or fill)")
end

_compute(x, ctx) = Compute(_req(_id, x, "kernel", ctx), _req(_tier_codes, x, "placement", ctx))

function _move(x, ctx)
    mode = _req(_mode, x, "mode", ctx)
    overlaps = _opt(_id, x, "overlaps", nothing, ctx)
    if mode === :async && overlaps === nothing
        _fail(ctx, "async move overlaps no kernel (its overlaps field is missing)")
    end
    return Move(_req(_id, x, "tensor", ctx), _req(_tier_name, x, "to", ctx), mode, overlaps)
end

_free(x, ctx) = Free(_req(_id, x, "tensor", ctx), _req(_tier_name, x, "tier", ctx))

_fill(x, ctx) = Fill(_req(_id, x, "tensor", ctx), _req(_float, x, "value", ctx))

function _recompute(x, ctx)
    outputs = _req(_ids, x, "outputs", ctx)
    isempty(outputs) && _fail(ctx, "recompute regenerates no outputs (its outputs list is empty)")
    return Recompute(_req(_id, x, "kernel", ctx), outputs, _req(_id, x, "before", ctx))
end

function _names(x, ctx)
    tensors = _opt(_tensor_table, x, "tensors", Dict{Int,TensorInfo}(), ctx)
    io = _opt(_kernel_io, x, "kernel_io", Tuple{Vector{Int},Vector{Int}}[], ctx)
    kernels = _opt((k, c) -> _kernel_table(k, io, c), x, "kernels", Dict{Int,KernelInfo}(), ctx)
    return tensors, kernels
end

function _tensor_table(x, ctx)
    out = Dict{Int,TensorInfo}()
    for (i, item) in enumerate(_array(x, ctx))
        c = "$ctx[$i]"
        row = _row(item, 4, c)
        info = TensorInfo(_id(row[1], c), _str(row[2], c), _int(row[3], c), _str(row[4], c))
        out[info.id] = info
    end
    return out
end

# kernel_io[i] holds [inputs, outputs] of the kernel with 0-based id i - 1 (kernels are dense).
function _kernel_io(x, ctx)
    out = Tuple{Vector{Int},Vector{Int}}[]
    for (i, item) in enumerate(_array(x, ctx))
        c = "$ctx[$i]"
        row = _row(item, 2, c)
        push!(out, (_ids(row[1], c), _ids(row[2], c)))
    end
    return out
end

function _kernel_table(x, io, ctx)
    out = Dict{Int,KernelInfo}()
    for (i, item) in enumerate(_array(x, ctx))
        c = "$ctx[$i]"
        row = _row(item, 3, c)
        id = _id(row[1], c)
        inputs, outputs = id < length(io) ? io[id+1] : (Int[], Int[])
        out[id] = KernelInfo(id, _str(row[2], c), _str(row[3], c), inputs, outputs)
    end
    return out
end

function _arena(x, ctx)
    return ArenaLayout(
        _req(_int, x, "bytes", ctx),
        _req(_int, x, "scratch_offset", ctx),
        _req(_int, x, "alignment", ctx),
        _req(_buffers, x, "buffers", ctx),
    )
end

function _buffers(x, ctx)
    out = ArenaBuffer[]
    for (i, item) in enumerate(_array(x, ctx))
        c = "$ctx[$i]"
        row = _row(item, 4, c)
        push!(out, ArenaBuffer(_int(row[1], c), _int(row[2], c), _int(row[3], c),
            _int(row[4], c)))
    end
    return out
end
