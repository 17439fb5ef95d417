"""`autotm_py.Trainer` on the CPU: a torch module and optimizer in, trained module out.

Each model trains 20 steps through the Trainer, at a budget whose plan moves and recomputes
tensors, and 20 steps of plain PyTorch (`loss.backward(); opt.step()` on a copy of the same
module, same optimizer settings, same batches); losses and final parameters, buffers and
optimizer state agree within a relative 1e-5 (docs/training-loop.md says where they are
bitwise). The GPU's numbers are measured by experiments/gpu/trainer_bench.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotm_py.errors import ConfigError
from autotm_py.trainer import Trainer

STEPS = 20
RTOL = 1e-5


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(32, 96), nn.Linear(96, 96), nn.Linear(96, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # no bias before a batch norm (it would cancel it; its gradient is rounding noise,
        # which Adam's normalized step would make a random walk)
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        # no qkv bias: the keys' bias has no gradient (a shift of every key leaves the
        # softmax as it is), only rounding noise, which Adam would make a random walk
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    """A decoder whose output layer is tied to its token embedding."""

    def __init__(self, vocab: int = 64, dim: int = 32, seq: int = 16) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, 4), Block(dim, 4)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def batches(name: str, n: int, scale: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` batches for model `name`, `scale` times the tests' batch size."""
    gen = torch.Generator().manual_seed(11)
    if name == "mlp":
        return [(torch.randn(256 * scale, 32, generator=gen),
                 torch.randint(0, 10, (256 * scale,), generator=gen)) for _ in range(n)]
    if name == "cnn":
        return [(torch.randn(16 * scale, 3, 16, 16, generator=gen),
                 torch.randint(0, 10, (16 * scale,), generator=gen)) for _ in range(n)]
    tokens = [torch.randint(0, 64, (32 * scale, 17), generator=gen) for _ in range(n)]
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


MODELS = {"mlp": (MLP, F.cross_entropy), "cnn": (CNN, F.cross_entropy), "lm": (TinyLM, lm_loss)}
OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=1e-4),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2),
}


def torch_training(model: nn.Module, make_opt, loss_fn, data) -> tuple[list[float], Any]:
    opt = make_opt(model.parameters())
    model.train()
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, opt


def trainer_training(model: nn.Module, make_opt, loss_fn, data, **kw):
    opt = make_opt(model.parameters())
    trainer = Trainer(model, opt, loss_fn, example=data[0], device="cpu", **kw)
    losses = [float(trainer.step(x, y)) for x, y in data]
    trainer.sync()
    return losses, opt, trainer


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=RTOL, atol=RTOL * float(b.abs().max().clamp(min=1e-12)))


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_through_the_trainer_equals_plain_pytorch(name, opt_name, tmp_path):
    make, loss_fn = MODELS[name]
    torch.manual_seed(0)
    reference = make()
    ours = copy.deepcopy(reference)
    data = batches(name, STEPS)
    want, want_opt = torch_training(reference, OPTIMIZERS[opt_name], loss_fn, data)
    got, got_opt, trainer = trainer_training(ours, OPTIMIZERS[opt_name], loss_fn, data,
                                             ratio="2:1", plans_dir=tmp_path)
    moves = sum(1 for _ in trainer.plan.moves())
    recomputes = sum(1 for _ in trainer.plan.recomputes())
    assert moves + recomputes > 0, "the budget should force moves or recomputes"
    assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=RTOL), (got, want)
    assert_trained_alike(ours, reference, got_opt, want_opt)


def test_plan_options_reach_the_plan_and_train_as_plain_pytorch(tmp_path):
    """`plan_options` sets more of the planner's options (here spread reads and writes, as
    `optimize --read-pricing spread --write-pricing spread`): the plan records them, its
    writes' sources are freed where the plan says, and training still equals PyTorch's."""
    torch.manual_seed(0)
    reference = MLP()
    ours = copy.deepcopy(reference)
    data = batches("mlp", 6)
    want, want_opt = torch_training(reference, OPTIMIZERS["adamw"], F.cross_entropy, data)
    got, got_opt, trainer = trainer_training(
        ours, OPTIMIZERS["adamw"], F.cross_entropy, data, ratio="2:1", plans_dir=tmp_path,
        plan_options={"write_pricing": "spread", "read_pricing": "spread", "async_window": 30})
    config = trainer.plan.header.config
    assert (config["write_pricing"], config["read_pricing"], config["async_window"]) == \
        ("spread", "spread", 30)
    assert sum(1 for _ in trainer.plan.moves()) + sum(1 for _ in trainer.plan.recomputes())
    assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=RTOL), (got, want)
    assert_trained_alike(ours, reference, got_opt, want_opt)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for options, message in (({"strategy": "sync"}, "set by the Trainer's own arguments"),
                             ({"pricing": 1}, "not a planning option; choose from"),
                             ({"write_pricing": "late"}, "--write-pricing 'late'")):
        with pytest.raises(ConfigError, match=message):
            Trainer(model, opt, F.cross_entropy, example=data[0], ratio="1:1", device="cpu",
                    plan_options=options)


def assert_trained_alike(ours: nn.Module, reference: nn.Module, got_opt, want_opt) -> None:
    """Parameters, buffers and optimizer state within RTOL of the reference's."""
    for (pname, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters(),
                                  strict=True):
        assert close(p.detach(), q.detach()), pname
    for (bname, b), (_, c) in zip(ours.named_buffers(), reference.named_buffers(), strict=True):
        assert torch.equal(b, c) if not b.is_floating_point() else close(b, c), bname
    for p, q in zip(ours.parameters(), reference.parameters(), strict=True):
        for key, value in want_opt.state[q].items():
            mine = got_opt.state[p][key]
            assert close(mine.float(), value.float()), (key, mine, value)


def test_a_chunked_loss_trains_a_tied_head_as_plain_pytorch_does(tmp_path):
    """loss_chunks: the head and its cross-entropy as one kernel over blocks of tokens (the
    logits never exist whole) train the tied embedding as torch does."""
    torch.manual_seed(3)
    reference = TinyLM()
    ours = copy.deepcopy(reference)
    data = batches("lm", 5)
    make_opt = OPTIMIZERS["sgd-momentum"]
    want, _ = torch_training(reference, make_opt, lm_loss, data)
    got, _, trainer = trainer_training(ours, make_opt, lm_loss, data, ratio="2:1",
                                       plans_dir=tmp_path, loss_chunks=4)
    assert trainer.graph.meta["training"]["loss_chunks"] == 4
    assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=RTOL), (got, want)
    for (pname, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters(),
                                  strict=True):
        assert close(p.detach(), q.detach()), pname


def test_auto_loss_chunks_chunk_a_large_vocabulary_on_a_gpu_only():
    """loss_chunks="auto" (the default): AUTO_LOSS_CHUNKS blocks on a GPU where the logits are
    at least AUTO_CHUNK_SHARE of the peak (a head of 4096 classes over 16-wide states: most of
    it), the plain loss where they are not (64 classes over 256-wide states), on the CPU, and
    where there is no head to chunk (the MLP's loss is over a Gemm too: chunkable, but its
    logits are small)."""
    from autotm_py.frontend.fuse import fuse_graph
    from autotm_py.ir.training import derive_training
    from autotm_py.trainer.core import AUTO_CHUNK_SHARE, AUTO_LOSS_CHUNKS, auto_loss_chunks
    from tests.test_training_models import tiny_decoder

    large = derive_training(fuse_graph(tiny_decoder(batch=4, seq=65, vocab=4096, d=16,
                                                     heads=2)))
    small = derive_training(fuse_graph(tiny_decoder(batch=4, seq=65, vocab=64, d=256,
                                                     heads=2)))
    share = [g.tensors[g.kernels[g.meta["training"]["loss_kernel"]].inputs[0]].nbytes
             / g.peak_live_bytes for g in (large, small)]
    assert share[0] > AUTO_CHUNK_SHARE > share[1], share
    assert auto_loss_chunks(large, "cuda", "bf16") == \
        auto_loss_chunks(large, "cuda:1", "bf16") == AUTO_LOSS_CHUNKS
    assert auto_loss_chunks(large, "cpu", "bf16") == 1 and \
        auto_loss_chunks(small, "cuda", "bf16") == 1
    chunked = derive_training(fuse_graph(tiny_decoder(batch=4, seq=65, vocab=4096, d=16,
                                                       heads=2)), loss_chunks=4)
    assert auto_loss_chunks(chunked, "cuda", "bf16") == 1  # already chunked: nothing to choose
    # fp32: the plain loss where the plain graph fits (no budget, or one of its peak), the
    # chunks under a smaller budget
    peak = large.peak_live_bytes
    assert auto_loss_chunks(large, "cuda", "fp32") == 1
    assert auto_loss_chunks(large, "cuda", "fp32", peak) == 1
    assert auto_loss_chunks(large, "cuda", "fp32", peak // 2) == AUTO_LOSS_CHUNKS
    assert auto_loss_chunks(large, "cuda", "bf16", peak) == AUTO_LOSS_CHUNKS


def test_the_trainers_budget_for_the_loss_chunks_choice_is_none_all_fast():
    """`_budget_of`: the budget `auto_loss_chunks` weighs, from the Trainer's arguments."""
    from autotm_py.trainer.core import _budget_of

    assert _budget_of(None, None) is None and _budget_of(None, "1:0") is None
    assert _budget_of(None, "1:3")(1000) == 250 and _budget_of(4096, None)(10) == 4096


def test_loss_chunks_take_a_whole_number_or_auto(tmp_path):
    model = TinyLM()
    x, y = batches("lm", 1)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad in (0, 2.5, "4", True):
        with pytest.raises(ConfigError, match=r"loss_chunks=.*whole number >= 1 or 'auto'"):
            Trainer(model, opt, lm_loss, example=(x, y), ratio="1:1", device="cpu",
                    plans_dir=tmp_path, loss_chunks=bad)
    trainer = Trainer(model, opt, lm_loss, example=(x, y), ratio="2:1", device="cpu",
                      plans_dir=tmp_path)  # "auto" on the CPU: the plain loss
    assert "loss_chunks" not in trainer.graph.meta["training"]
    assert not any("blocks of tokens" in n for n in trainer.notes)


def test_a_scheduler_changes_the_learning_rate_without_a_new_plan(tmp_path):
    torch.manual_seed(1)
    reference = MLP()
    ours = copy.deepcopy(reference)
    data = batches("mlp", 6)

    def run(model, trainer=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        step = Trainer(model, opt, F.cross_entropy, example=data[0], device="cpu",
                       ratio="2:1", plans_dir=tmp_path) if trainer else None
        losses = []
        for x, y in data:
            if step is None:
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            else:
                loss = step.step(x, y)
            losses.append(float(loss))
            sched.step()
        if step is not None:
            step.sync()
        return losses, step

    want, _ = run(reference)
    got, trainer = run(ours, trainer=True)
    assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=RTOL)
    plan = trainer.plan
    # a second Trainer of the same model and budget takes the kept plan
    twin = copy.deepcopy(reference)
    again = Trainer(twin, torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9),
                    F.cross_entropy, example=data[0], device="cpu", ratio="2:1",
                    plans_dir=tmp_path)
    assert again.plan.to_json() == plan.to_json()


def test_bad_inputs_are_one_line_errors(tmp_path):
    model = MLP()
    x, y = batches("mlp", 1)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"either budget .* or ratio"):
        Trainer(model, opt, F.cross_entropy, example=(x, y), device="cpu")
    with pytest.raises(ConfigError, match="RMSprop is not supported"):
        Trainer(model, torch.optim.RMSprop(model.parameters()), F.cross_entropy,
                example=(x, y), ratio="1:1", device="cpu")
    with pytest.raises(ConfigError, match="losses the Trainer derives"):
        Trainer(model, opt, lambda out, t: out.abs().mean(), example=(x, y), ratio="1:1",
                device="cpu")
    with pytest.raises(ConfigError, match=r"give \(inputs, labels\)"):
        Trainer(model, opt, F.cross_entropy, example=x, ratio="1:1", device="cpu")
    trainer = Trainer(model, opt, F.cross_entropy, example=(x, y), ratio="2:1", device="cpu",
                      plans_dir=tmp_path)
    with pytest.raises(ConfigError, match="drop_last=True"):
        trainer.step(x[:5], y[:5])
    # the loss is matched on the exported graph's output: one tensor
    with pytest.raises(ConfigError, match="returns 2 tensors: the Trainer takes modules whose "
                                          "forward returns one tensor"):
        two = TwoOutputs()
        Trainer(two, torch.optim.SGD(two.parameters(), lr=0.1), F.cross_entropy, example=(x, y),
                ratio="1:1", device="cpu")


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y, y.relu()


def test_a_plan_priced_with_another_gpus_kernel_times_says_so_in_the_trainers_notes(tmp_path):
    from autotm_py.costs import BORROWED_NOTE
    from autotm_py.trainer.loop import Loop

    torch.manual_seed(2)
    model = MLP()
    data = batches("mlp", 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      example=data[0], device="cpu", ratio="2:1", plans_dir=tmp_path)
    borrowed = f"{BORROWED_NOTE}3 of 40 kernel times come from profiles of the NVIDIA H100"
    plan = trainer.plan.with_header(notes=(*trainer.plan.header.notes, borrowed))
    loop = Loop(trainer.run_graph, plan, "cpu", trainer.mode, dict(trainer.loop.executor.masters))
    assert loop.notes == [borrowed]
    assert not any(n.startswith(BORROWED_NOTE) for n in trainer.notes)
    moves = sum(1 for _ in trainer.plan.moves())
    assert trainer.describe().startswith("budget ") and \
        f"({trainer.plan.header.budget_bytes / trainer.run_graph.peak_live_bytes:.0%}): " \
        f"{moves} moves, " in trainer.describe()
