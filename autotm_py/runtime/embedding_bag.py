"""Embedding-bag lookups over a table placed at row blocks (docs/embeddings.md, "Executor").

A block is served from one of three places (the codes of `planning.embeddings`):
- ``HBM`` (1): its rows live in a device tensor;
- ``HOST`` (0): its rows live in pinned host memory, and the lookup reads them *zero-copy*: on
  CUDA the pinned tensor is aliased as a device tensor through ``__cuda_array_interface__`` (with
  unified addressing, pinned host memory has the same address on the device), so torch's own
  gather kernel reads those rows over PCIe without copying the block;
- ``COPY`` (2): its rows live in host memory too, and before the batch `prefetch` gathers the
  distinct rows the batch needs (``index_select`` on the host) and copies them, non-blocking,
  into an HBM staging buffer.

`PlacedTables.lookup` gathers every index's row (all tables at once, as table-batched
embeddings do) from where its block lives, then sums (or averages) the bags with
``embedding_bag`` over the gathered rows: per table, the result equals
``torch.nn.functional.embedding_bag`` on the whole table. On the CPU every tier is a CPU tensor
(the tests and ``--small``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

HOST, HBM, COPY = 0, 1, 2  # as planning.embeddings
_TYPESTR = {torch.float32: "<f4", torch.float16: "<f2", torch.float64: "<f8"}


class _Mapped:
    """A pinned host tensor presented as device memory (its unified-address pointer)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host  # kept alive by the device alias, which holds this object
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape), "typestr": _TYPESTR[host.dtype],
            "data": (host.data_ptr(), False), "version": 2, "strides": None}


def zero_copy_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (pinned, contiguous) as a CUDA tensor whose reads go over the link; on a CPU
    device, `host` itself."""
    if device.type != "cuda":
        return host
    if not host.is_pinned():
        raise ValueError("zero-copy needs pinned host memory")
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    return torch.as_tensor(_Mapped(host.contiguous()), device=device)


def pinned_empty(rows: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Host memory pinned in place (``cudaHostRegister``, portable and mapped): torch's pinned
    allocator rounds a request up to a power of two, which for tens of GB would pin up to twice
    the bytes. The registration lasts as long as the process (it is never freed here)."""
    host = torch.empty(rows, dim, dtype=dtype)
    if host.numel():
        err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(),
                                                   host.numel() * host.element_size(), 3)
        if not err == 0:
            raise RuntimeError(f"cudaHostRegister of {host.numel() * host.element_size()} "
                               f"bytes failed: {err}")
    return host


@dataclass
class Staged:
    """One batch's copied-ahead rows: the staging rows, and each COPY index's row in them."""

    rows: torch.Tensor
    slots: torch.Tensor  # for the indices whose block is COPY, in their order in the batch


class PlacedTables:
    """Tables of one width looked up together (as table-batched embeddings are), each table's
    blocks of `block_rows` rows placed by its codes in `where`. The host tier keeps every row of
    every table (one pinned tensor, the tables one after another); HBM keeps copies of the
    resident blocks (one device tensor)."""

    def __init__(self, rows: list[int], dim: int, where: list[np.ndarray], block_rows: int,
                 device: str | torch.device = "cpu") -> None:
        """The block maps only; `from_weights` or `uninitialized` fill the tiers."""
        self.device = torch.device(device)
        self.rows, self.dim, self.block_rows = list(rows), dim, block_rows
        nb = [-(-r // block_rows) for r in rows]
        if [len(w) for w in where] != nb:
            raise ValueError(f"block codes per table {[len(w) for w in where]}, blocks {nb}")
        codes = np.concatenate([np.asarray(w, dtype=np.int8) for w in where])
        sizes = np.concatenate([_block_sizes(r, block_rows) for r in rows])
        fast = codes == HBM
        # a block's first row in its tier: resident blocks packed in order, host rows as they are
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        base[fast] = np.cumsum(sizes[fast]) - sizes[fast]
        self.row_fast = np.repeat(fast, sizes)
        self.fast_rows = int(sizes[fast].sum())
        self.block_start = torch.as_tensor(np.concatenate([[0], np.cumsum(nb)[:-1]]))
        self.code = torch.as_tensor(codes, device=self.device)
        self.base = torch.as_tensor(base, device=self.device)
        self.host_code, self.host_base = torch.as_tensor(codes), torch.as_tensor(base)
        self.dev_block_start = self.block_start.to(self.device)

    def _install(self, fast: torch.Tensor, host: torch.Tensor) -> PlacedTables:
        if self.device.type == "cuda" and not host.is_pinned():
            host = host.pin_memory()
        self.fast, self.host = fast, host
        self.host_view = zero_copy_view(host, self.device)
        return self

    @classmethod
    def from_weights(cls, weights: list[torch.Tensor], where: list[np.ndarray],
                     block_rows: int, device: str | torch.device = "cpu") -> PlacedTables:
        """The tables' `weights` (on the host): all rows in host memory, resident blocks
        copied to HBM."""
        tables = cls([w.shape[0] for w in weights], weights[0].shape[1], where, block_rows,
                     device)
        host = torch.cat(weights).contiguous()
        fast = host[torch.as_tensor(tables.row_fast)].to(tables.device)
        return tables._install(fast, host)

    @classmethod
    def uninitialized(cls, rows: list[int], dim: int, where: list[np.ndarray],
                      block_rows: int, device: str | torch.device = "cpu",
                      host: torch.Tensor | None = None) -> PlacedTables:
        """Tiers of the right sizes, values unset (timing tables too big to fill); `host`: a
        host tier to share between placements."""
        tables = cls(rows, dim, where, block_rows, device)
        if host is None:
            host = pinned_empty(sum(rows), dim) if tables.device.type == "cuda" else \
                torch.empty(sum(rows), dim)
        return tables._install(torch.empty(tables.fast_rows, dim, device=tables.device), host)

    def _slots(self, indices: list[torch.Tensor], on_device: bool,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each index's code and row in its tier's storage (indices of all tables, in order)."""
        starts = self.dev_block_start if on_device else self.block_start
        code, base = (self.code, self.base) if on_device else (self.host_code, self.host_base)
        block = torch.cat([torch.div(ix, self.block_rows, rounding_mode="floor") + starts[t]
                           for t, ix in enumerate(indices)])
        within = torch.cat([ix.remainder(self.block_rows) for ix in indices])
        return code[block], base[block] + within

    def prefetch(self, indices: list[torch.Tensor], non_blocking: bool = True,
                 ) -> Staged | None:
        """Copy ahead the distinct rows of COPY blocks that the batch's `indices` read."""
        code, slot = self._slots([ix.cpu() for ix in indices], on_device=False)
        wanted = slot[code == COPY]
        if wanted.numel() == 0:
            return None
        unique, inverse = torch.unique(wanted, return_inverse=True)
        gathered = self.host.index_select(0, unique)
        if self.device.type == "cuda":
            gathered = gathered.pin_memory()
        return Staged(gathered.to(self.device, non_blocking=non_blocking),
                      inverse.to(self.device, non_blocking=non_blocking))

    def gather(self, indices: list[torch.Tensor], staged: Staged | None = None,
               ) -> torch.Tensor:
        """The row of every index (all tables, in order), each from where its block lives;
        one device-to-host synchronization (the count of indices per tier)."""
        code, slot = self._slots([ix.to(self.device) for ix in indices], on_device=True)
        order = torch.argsort(code, stable=True)
        counts = torch.bincount(code.long(), minlength=3).tolist()
        at_host, at_hbm, at_copy = order.split(counts[:3])
        out = torch.empty(len(code), self.dim, dtype=self.host.dtype, device=self.device)
        out[at_hbm] = self.fast.index_select(0, slot[at_hbm])
        out[at_host] = self.host_view.index_select(0, slot[at_host])
        if len(at_copy):
            if staged is None:
                raise ValueError("indices read copy-ahead blocks: prefetch them first")
            out[at_copy] = staged.rows.index_select(0, staged.slots)
        return out

    def lookup(self, indices: list[torch.Tensor], offsets: list[torch.Tensor], *,
               mode: str = "sum", staged: Staged | None = None) -> list[torch.Tensor]:
        """Per table, ``embedding_bag(indices[t], table t, offsets[t], mode)``."""
        rows = self.gather(indices, staged)
        starts = np.cumsum([0] + [len(ix) for ix in indices])
        bags = torch.cat([off.to(self.device) + int(s) for off, s in zip(offsets, starts,
                                                                         strict=False)])
        positions = torch.arange(len(rows), device=self.device)
        pooled = F.embedding_bag(positions, rows, bags, mode=mode)
        return list(pooled.split([len(off) for off in offsets]))


def _block_sizes(rows: int, block_rows: int) -> np.ndarray:
    sizes = np.full(-(-rows // block_rows), block_rows, dtype=np.int64)
    sizes[-1] = rows - block_rows * (len(sizes) - 1)
    return sizes
