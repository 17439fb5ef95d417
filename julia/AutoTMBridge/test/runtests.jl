# Tests of AutoTMBridge: `julia --project=julia/AutoTMBridge -e 'import Pkg; Pkg.test()'`.
#
# fixtures/plan_small.json is written by autotm_py (`python -m tests.test_julia_schema`), and
# fixtures/plan_small.expected.json holds what Python computes from the same plan; the Python
# suite checks that both are current, so these tests compare the two languages.

using AutoTMBridge
using Test
import JSON

const FIXTURES = joinpath(@__DIR__, "fixtures")
const PLAN_PATH = joinpath(FIXTURES, "plan_small.json")
const EXPECTED = JSON.parse(read(joinpath(FIXTURES, "plan_small.expected.json"), String);
    dicttype=Dict{String,Any})

raw_plan() = JSON.parse(read(PLAN_PATH, String); dicttype=Dict{String,Any})
opname(r::Record) = r isa Compute ? "compute" : r isa Move ? "move" :
    r isa Recompute ? "recompute" : "free"

# An executor that only logs what it is asked to do (callback interface).
struct LogExecutor
    log::Vector{String}
end

# An executor that tracks residency and checks the plan's memory rules while it walks the
# schedule (dispatch interface): inputs resident where the placement says, moves from a tier
# that holds the tensor, frees of copies that exist.
struct ResidencyExecutor
    plan::Plan
    where_::Dict{Int,Set{Tier}}
end

ResidencyExecutor(plan::Plan) =
    ResidencyExecutor(plan, Dict(t => Set(tiers) for (t, tiers) in plan.initial))

function AutoTMBridge.on_compute!(ex::ResidencyExecutor, r::Compute)
    inputs, outputs = kernel_io(ex.plan, r.kernel)
    for (slot, t) in enumerate(inputs)
        r.placement[slot] in get(ex.where_, t, Set{Tier}()) ||
            error("tensor $t is not in $(r.placement[slot]) for kernel $(r.kernel)")
    end
    for (j, t) in enumerate(outputs)
        ex.where_[t] = Set([r.placement[length(inputs)+j]])
    end
end

function AutoTMBridge.on_move!(ex::ResidencyExecutor, r::Move)
    from = r.to == FAST ? SLOW : FAST
    from in get(ex.where_, r.tensor, Set{Tier}()) || error("tensor $(r.tensor) is not in $from")
    push!(ex.where_[r.tensor], r.to)
end

function AutoTMBridge.on_recompute!(ex::ResidencyExecutor, r::Recompute)
    inputs, outputs = kernel_io(ex.plan, r.kernel)
    for t in inputs
        FAST in get(ex.where_, t, Set{Tier}()) ||
            error("tensor $t is not in FAST to recompute kernel $(r.kernel)")
    end
    for t in r.outputs
        t in outputs || error("tensor $t is not an output of kernel $(r.kernel)")
        isempty(get(ex.where_, t, Set{Tier}())) || error("tensor $t is not absent")
        ex.where_[t] = Set([FAST])
    end
end

function AutoTMBridge.on_free!(ex::ResidencyExecutor, r::Free)
    r.tier in get(ex.where_, r.tensor, Set{Tier}()) || error("tensor $(r.tensor) not in $(r.tier)")
    delete!(ex.where_[r.tensor], r.tier)
end

# The message of the PlanError that `f()` throws ("" when it throws none).
function plan_error_message(f)
    try
        f()
    catch err
        err isa PlanError && return err.msg
        rethrow()
    end
    return ""
end

@testset "AutoTMBridge" begin
    plan = read_plan(PLAN_PATH)

    @testset "parse the fixture written by Python" begin
        h = plan.header
        @test h.format_version == FORMAT_VERSION
        @test h.model_hash == EXPECTED["model_hash"]
        @test h.model_name == EXPECTED["model_name"]
        @test h.strategy == "async"
        @test h.budget_bytes == 12288
        @test h.memory_system["mode"] == "host"
        @test h.device == EXPECTED["device"]
        @test h.model !== nothing && h.model.batch == EXPECTED["batch"]
        @test h.costs !== nothing && h.costs.digest == EXPECTED["costs_digest"]
        @test h.pin_weights == false
        @test h.solver.status == "optimal"
        @test h.solver.time_limit_s === nothing
        @test h.solver.hit_time_limit == false
        @test h.notes == ["hand-built fixture for the AutoTMBridge tests"]
        @test length(plan) == EXPECTED["n_records"]
        @test [opname(r) for r in plan] == EXPECTED["ops"]
        @test plan.initial == Dict(0 => [SLOW])
        @test [lowercase.(string.(c.placement)) for c in computes(plan)] == EXPECTED["placements"]
    end

    @testset "the arena's planned offsets" begin
        @test plan.header.run.replay == EXPECTED["replay"]
        @test plan.header.run.arena == EXPECTED["run_arena"]
        @test plan.arena !== nothing
        @test plan.arena.nbytes == EXPECTED["arena_bytes"]
        @test plan.arena.scratch_offset == EXPECTED["arena_scratch_offset"]
        @test [[b.record, b.tensor, b.offset] for b in plan.arena.buffers] ==
              EXPECTED["arena_offsets"]
        for (record, tensor, offset) in EXPECTED["arena_offsets"]
            @test arena_offset(plan, record, tensor) == offset
        end
        @test arena_offset(plan, 0, 99) === nothing
        legacy = raw_plan()
        delete!(legacy, "arena")
        delete!(legacy["header"], "run")
        delete!(legacy["header"], "gpu")
        legacy["format_version"] = legacy["header"]["format_version"] = 2
        old = plan_from_dict(legacy)
        @test old.arena === nothing && old.header.run.replay == false && old.header.gpu === nothing
        @test old.header.run.scratch == "region"
        @test arena_offset(old, 0, 0) === nothing
    end

    @testset "the same plan from a path, text, IO and a Dict" begin
        text = read(PLAN_PATH, String)
        for other in (read_plan(text), parse_plan(text), open(read_plan, PLAN_PATH),
            plan_from_dict(raw_plan()))
            @test other.records == plan.records
            @test other.header.model_hash == plan.header.model_hash
        end
    end

    @testset "records" begin
        @test plan[1] == Move(0, FAST, :sync, nothing)
        @test plan[2] == Compute(0, [FAST, FAST])
        @test plan[3] == Move(1, SLOW, :async, 1)
        @test plan[end] == Free(2, FAST)
        @test plan[7] == Recompute(1, [2], 2)
        @test [[r.kernel, r.outputs, r.before] for r in recomputes(plan)] == EXPECTED["recomputes"]
        @test eltype(plan) == Record
        @test collect(plan) == plan.records
        @test length(computes(plan)) + length(moves(plan)) + length(frees(plan)) +
              length(recomputes(plan)) == length(plan)
        @test tier_code(FAST) == 'F' && tier_code(SLOW) == 'S'
    end

    @testset "queries keep the plan's 0-based ids" begin
        for (id, name) in EXPECTED["tensor_names"]
            @test tensor_name(plan, parse(Int, id)) == name
        end
        for (id, name) in EXPECTED["kernel_names"]
            @test kernel_name(plan, parse(Int, id)) == name
        end
        for (id, io) in EXPECTED["kernel_io"]
            @test kernel_io(plan, parse(Int, id)) == (Vector{Int}(io[1]), Vector{Int}(io[2]))
        end
        @test tensor_bytes(plan, 0) == 4096
        @test bytes_moved(plan) == EXPECTED["bytes_moved"]
        @test bytes_moved(plan; to=FAST) == EXPECTED["bytes_moved_to_fast"]
        @test bytes_moved(plan; to=SLOW) == EXPECTED["bytes_moved_to_slow"]
        @test initial_tiers(plan, 0) == [SLOW]
        @test isempty(initial_tiers(plan, 3))
        @test_throws ArgumentError tensor_name(plan, 99)
        @test_throws ArgumentError kernel_name(plan, -1)
    end

    @testset "apply_plan! with callbacks" begin
        ex = LogExecutor(String[])
        out = apply_plan!(ex, plan;
            compute=(e, r) -> push!(e.log, "compute $(r.kernel)"),
            move=(e, r) -> push!(e.log, "move $(r.tensor) $(r.mode)"),
            free=(e, r) -> push!(e.log, "free $(r.tensor)"),
            recompute=(e, r) -> push!(e.log, "recompute $(r.kernel) before $(r.before)"))
        @test out === ex
        @test ex.log[1:3] == ["move 0 sync", "compute 0", "move 1 async"]
        @test length(ex.log) == length(plan)
        # an async move stands right before the compute of the kernel it overlaps
        @test ex.log[4] == "compute $(plan[3].overlaps)"
        # a recompute stands right before the compute of the kernel it regenerates for
        @test ex.log[7:8] == ["recompute 1 before 2", "compute 2"]
    end

    @testset "apply_plan! through dispatch checks residency" begin
        ex = apply_plan!(ResidencyExecutor(plan), plan)
        @test ex.where_[1] == Set{Tier}()          # `a` was offloaded, read from slow, freed
        @test ex.where_[3] == Set([FAST])          # the output stays in fast memory
        @test ex.where_[2] == Set{Tier}()          # `b` was regenerated, then freed
        broken = Plan(plan.header, plan.initial, Record[Compute(2, [FAST, FAST, FAST])],
            plan.tensors, plan.kernels)
        err = try
            apply_plan!(ResidencyExecutor(broken), broken)
            nothing
        catch e
            e
        end
        @test err isa RecordError
        @test err.index == 1
        @test occursin("tensor 1 is not in FAST", sprint(showerror, err))
        # a regeneration whose input is absent fails like any other record
        early = Plan(plan.header, plan.initial, Record[Recompute(1, [2], 2)],
            plan.tensors, plan.kernels)
        err = try
            apply_plan!(ResidencyExecutor(early), early)
            nothing
        catch e
            e
        end
        @test err isa RecordError
        @test occursin("tensor 0 is not in FAST to recompute kernel 1", sprint(showerror, err))
    end

    @testset "a missing handler is a RecordError naming the fix" begin
        err = try
            apply_plan!(:no_executor, plan)
            nothing
        catch e
            e
        end
        @test err isa RecordError
        @test err.cause isa ArgumentError
        @test occursin("on_move!", sprint(showerror, err))
    end

    @testset "unreadable plans raise PlanError with the field and the fix" begin
        @test occursin("no plan file", plan_error_message(() -> read_plan("/nonexistent/plan.json")))
        @test occursin("not valid JSON", plan_error_message(() -> read_plan("{\"format\": ")))
        d = raw_plan()
        d["format"] = "other"
        @test occursin("not an autotm plan", plan_error_message(() -> plan_from_dict(d)))
        d = raw_plan()
        d["format_version"] = FORMAT_VERSION + 1
        @test occursin("version $(FORMAT_VERSION + 1) is not supported",
            plan_error_message(() -> plan_from_dict(d)))
        d = raw_plan()
        delete!(d["header"]["solver"], "status")
        msg = plan_error_message(() -> plan_from_dict(d; origin="p.json"))
        @test startswith(msg, "p.json: header.solver: missing field \"status\"")
        d = raw_plan()
        d["records"][2]["placement"] = "FX"
        @test occursin("records[2].placement: unknown tier code 'X'",
            plan_error_message(() -> plan_from_dict(d)))
        d = raw_plan()
        delete!(d["records"][3], "overlaps")
        @test occursin("async move overlaps no kernel", plan_error_message(() -> plan_from_dict(d)))
        d = raw_plan()
        d["records"][1]["tensor"] = "zero"
        @test occursin("expected an integer", plan_error_message(() -> plan_from_dict(d)))
        d = raw_plan()
        d["records"][7]["outputs"] = Any[]
        @test occursin("records[7]: recompute regenerates no outputs",
            plan_error_message(() -> plan_from_dict(d)))
        d = raw_plan()
        d["initial"]["x"] = "F"
        @test occursin("not a 0-based tensor id", plan_error_message(() -> plan_from_dict(d)))
    end

    @testset "names are optional" begin
        d = raw_plan()
        d["names"] = Dict{String,Any}()
        bare = plan_from_dict(d)
        @test length(bare) == length(plan)
        @test isempty(bare.tensors) && isempty(bare.kernels)
        @test_throws ArgumentError bytes_moved(bare)
    end
end
