"""An arena run (CPU: the GPU's planned addresses without the placed allocator) of a Trainer's
transformer: its SGD updates run as one multi-tensor update (`ArenaMemory._run_sgd`), its
reshapes take their inputs' slots (`arena._alias_views`: nothing copied), whether the input dies
at the reshape or lives on, and both change no bit of the training."""

from __future__ import annotations

import copy

import torch

from autotm_py import arena, pipeline
from autotm_py.arena import SAME_BYTES_VIEWS, frees_after
from autotm_py.kernels.grad_tensor import descend, sgd_update_many
from autotm_py.options import RunMode
from autotm_py.plan import Compute
from autotm_py.runtime import memory
from autotm_py.trainer import Trainer
from tests.test_trainer import TinyLM, batches, lm_loss

ARENA = RunMode(arena=True, placed=False)


def _train(tmp_path, mode, steps=4, foreach=True, monkeypatch=None):
    torch.manual_seed(0)
    model = TinyLM()
    data = batches("lm", steps)
    if not foreach:
        monkeypatch.setattr(memory, "sgd_runs", lambda graph, plan: {})
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), lm_loss,
                      example=data[0], device="cpu", ratio="1:0", mode=mode,
                      plans_dir=tmp_path / str(mode.arena), time_limit_s=60)
    losses = [trainer.step(x, y).clone() for x, y in data]
    trainer.sync()
    return trainer, losses, copy.deepcopy(model.state_dict())


def test_arena_sgd_runs_as_one_update_and_views_copy_nothing(tmp_path, monkeypatch):
    trainer, losses, state = _train(tmp_path, ARENA)
    ex = trainer.loop.executor
    runs = ex.memory._sgd_runs
    updates = sum(1 for k in trainer.graph.kernels if k.op_type == "SGDUpdate")
    assert runs and sum(len(r) for r in runs.values()) == updates
    assert ex.state.updated == {i for r in runs.values() for i in r}
    # every reshape is packed at its input's offset, and found there (`placed`: an output
    # already in its slot, not copied); the attention's output, which its backward reads,
    # shares its slot with its reshape back to (B, L, H E)
    graph, plan = trainer.graph, trainer.plan
    offsets = plan.arena.offsets()
    views = aliased = of_live = 0
    for index, record in enumerate(plan.records):
        kernel = graph.kernels[record.kernel] if isinstance(record, Compute) else None
        if kernel is None or kernel.op_type not in SAME_BYTES_VIEWS:
            continue
        src = max((key for key in offsets if key[1] == kernel.inputs[0] and key[0] <= index),
                  default=None)
        same = src is not None and offsets[src] == offsets[(index, kernel.outputs[0])]
        views += 1
        aliased += same
        of_live += same and not frees_after(plan.records, index, kernel.inputs[0])
    assert views >= 8 and aliased == views and of_live >= 2 and ex.state.placed >= aliased
    # the same training as torch's allocator and as the arena without the multi-tensor update
    _, eager_losses, eager_state = _train(tmp_path / "eager", RunMode(placed=False))
    _, one_losses, one_state = _train(tmp_path / "one", ARENA, foreach=False,
                                      monkeypatch=monkeypatch)
    for other_losses, other_state in ((eager_losses, eager_state), (one_losses, one_state)):
        assert all(torch.equal(a, b) for a, b in zip(losses, other_losses, strict=True))
        assert all(torch.equal(state[k], other_state[k]) for k in state)


def test_many_sgd_updates_equal_one_at_a_time():
    """`sgd_update_many` (float lr: foreach add) computes `descend` bit for bit; forms it
    cannot compute so (momentum with a float lr, an lr tensor off CUDA) are refused."""
    gen = torch.Generator().manual_seed(3)
    ws = [torch.randn(17, 5, generator=gen) for _ in range(4)]
    gs = [torch.randn(17, 5, generator=gen) for _ in range(4)]
    want = [descend(w, g, 0.03) for w, g in zip(ws, gs, strict=True)]
    got = [w.clone() for w in ws]
    assert sgd_update_many(got, gs, [], 0.03)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert not sgd_update_many(got, gs, [], 0.03, momentum=0.9)
    assert not sgd_update_many(got, gs, [], torch.tensor(0.03))


def test_channels_last_weights_update_as_one_multi_tensor_kernel_with_their_like():
    """The fused SGD kernel (CUDA) takes dense tensors of one dtype whose weight, gradient and
    buffer are laid out alike: channels-last ones too (a bf16 CNN's fp32 masters, whose casts
    keep the layout), not a gradient laid out otherwise, a transposed view or another dtype."""
    from autotm_py.kernels.grad_tensor import fusable_lists

    def cl(*shape):
        return torch.randn(*shape).contiguous(memory_format=torch.channels_last)

    assert fusable_lists([cl(4, 3, 2, 2), torch.randn(5)], [cl(4, 3, 2, 2), torch.randn(5)],
                         [cl(4, 3, 2, 2), torch.randn(5)])
    assert fusable_lists([torch.randn(5)], [torch.randn(5)], [])  # no buffers: plain SGD
    assert not fusable_lists([cl(4, 3, 2, 2)], [torch.randn(4, 3, 2, 2)])
    assert not fusable_lists([torch.randn(4, 3).t()], [torch.randn(4, 3).t()])
    assert not fusable_lists([torch.randn(4)], [torch.randn(4).double()])


def test_chains_of_views_share_one_slot_and_the_packing_verifies():
    """The corpus Llama's repeated key/value heads (Reshape, Unsqueeze) and their gradients'
    ReshapeGrad pairs are chains of views: each chain is one group in one slot, as is a view
    of a tensor that lives on; the strict simulator accepts the packing, and the live peak
    counts each group's slot once (at most the arena's extent)."""
    from autotm_py.options import ModelOptions
    from autotm_py.workload import load_graph

    graph = load_graph("models/corpus/llama_gqa.onnx", ModelOptions(training=True))
    plan = pipeline.all_fast_plan(graph)
    machine = pipeline._arena_machine(graph, plan, None, None)
    life = arena.lifetimes(machine, plan)
    views = [(i, graph.kernels[r.kernel]) for i, r in enumerate(plan.records)
             if isinstance(r, Compute) and graph.kernels[r.kernel].op_type in SAME_BYTES_VIEWS]
    assert views and all((i, k.outputs[0]) in life.in_place for i, k in views)
    assert any(len(group) > 2 for group in life.groups)  # a chain
    layout = arena.pack(machine, plan)
    assert arena.overlapping(layout, life) is None
    assert life.live_peak() <= layout.scratch_offset
    pipeline.simulate(graph, plan.with_arena(layout))  # strict: raises on a violation
