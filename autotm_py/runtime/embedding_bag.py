"""Embedding-bag lookups over a table placed at row blocks (docs/embeddings.md, "Executor").

A block is served from one of three places (the codes of `planning.embeddings`):
- ``HBM`` (1): its rows live in a device tensor;
- ``HOST`` (0): its rows live in pinned host memory, and the lookup reads them *zero-copy*: on
  CUDA the pinned tensor is aliased as a device tensor through ``__cuda_array_interface__`` (with
  unified addressing, pinned host memory has the same address on the device), so torch's own
  ``embedding_bag`` kernel reads those rows over PCIe without copying the block;
- ``COPY`` (2): its rows live in host memory too, and before the batch `prefetch` gathers the
  distinct rows the batch needs (on the host, with numpy, into pinned memory) and copies them,
  non-blocking, into an HBM staging buffer.

`PlacedTables.lookup` looks up all tables at once (as table-batched embeddings do) in a fixed
number of device kernels, whatever the number of tables, and without waiting for the device:
the block -> row maps are device tensors built once with the placement, every index is
remapped in one vectorised pass, and the HBM and zero-copy rows are pooled by *one*
``embedding_bag`` over a *unified view*: one tensor whose rows are both tiers' rows (on CUDA an
alias over the unified address space that spans the HBM tier and the pinned host tier, the
HBM tier allocated at a whole number of rows from the host tier; on the CPU one buffer holding
both). Each index then reads its own row where it lives, and nothing else. Copied-ahead rows
are pooled by a second ``embedding_bag`` over the staging rows (its pad, ``padding_idx``, is in
HBM), and the sums added.

Why not one ``embedding_bag`` per tier with the other tiers' indices pointed at a pad
(``padding_idx``), as the executor first did (``lookup(..., padded=True)`` still does): torch's
CUDA kernel *loads* the pad row for every pad index and only then zeroes it
(``EmbeddingBag_updateOutputKernel_sum_mean``: ``weightValue = weightFeat[weightRow]; weightValue
= pad ? 0 : weightValue``). The host tier's kernel therefore read one row of pinned host memory
over PCIe for every lookup served from HBM: as many link reads as an all-host lookup, all of one
row, more of them the more the placement keeps in HBM (docs/embeddings.md, "The executor").
Per table, the result equals ``torch.nn.functional.embedding_bag`` on the whole table (sum or
mean). On the CPU every tier is a CPU tensor (the tests and ``--small``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from autotm_py.runtime.pinned import pinned_host_buffer

HOST, HBM, COPY = 0, 1, 2  # as planning.embeddings
_TYPESTR = {torch.float32: "<f4", torch.float16: "<f2", torch.float64: "<f8"}


class _Mapped:
    """Memory at a unified-address pointer presented as a CUDA tensor of `shape` (rows,
    width), contiguous; `keep`: the tensors that own the memory, kept alive by the alias."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: torch.dtype,
                 keep: tuple[torch.Tensor, ...]) -> None:
        self.keep = keep  # kept alive by the device alias, which holds this object
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": _TYPESTR[dtype],
            "data": (ptr, False), "version": 2, "strides": None}


def zero_copy_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (pinned, contiguous) as a CUDA tensor whose reads go over the link; on a CPU
    device, `host` itself."""
    if device.type != "cuda":
        return host
    if not host.is_pinned():
        raise ValueError("zero-copy needs pinned host memory")
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    host = host.contiguous()
    return torch.as_tensor(_Mapped(host.data_ptr(), tuple(host.shape), host.dtype, (host,)),
                           device=device)


def unified_view(parts: list[torch.Tensor], device: torch.device,
                 ) -> tuple[torch.Tensor, list[int]] | None:
    """One CUDA tensor whose rows include the rows of every part (2-D, one dtype and width,
    contiguous; device memory or pinned, mapped host memory), and each part's first row in it;
    None where some part does not start a whole number of rows from the others. With unified
    addressing, device allocations and mapped host memory share one address space, so the
    alias spans from the lowest part to the end of the highest; only the parts' rows are ever
    read (the addresses between them may be unmapped)."""
    parts = [p for p in parts if p.numel()]
    row_bytes = parts[0].shape[1] * parts[0].element_size()
    base = min(p.data_ptr() for p in parts)
    if any((p.data_ptr() - base) % row_bytes for p in parts):
        return None
    end = max(p.data_ptr() + p.numel() * p.element_size() for p in parts)
    view = torch.as_tensor(_Mapped(base, ((end - base) // row_bytes, parts[0].shape[1]),
                                   parts[0].dtype, tuple(parts)), device=device)
    return view, [(p.data_ptr() - base) // row_bytes for p in parts]


def rows_aligned_with(like: torch.Tensor, rows: int, dim: int,
                      device: torch.device) -> torch.Tensor:
    """An uninitialized (rows, dim) device tensor whose address is a whole number of rows from
    `like`'s (one spare row allocated to shift within), so that `unified_view` can span both;
    where no shift can do it (addresses apart by no whole number of elements), unaligned."""
    elem = like.element_size()
    flat = torch.empty((rows + 1) * dim, dtype=like.dtype, device=device)
    gap = (like.data_ptr() - flat.data_ptr()) % (dim * elem)
    shift = gap // elem if gap % elem == 0 else 0
    return flat[shift:shift + rows * dim].view(rows, dim)


def pinned_empty(rows: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Host memory pinned in place, portable and mapped (`pinned_host_buffer`): torch's pinned
    allocator rounds a request up to a power of two, which for tens of GB would pin up to twice
    the bytes. The rows start on a 4 KiB boundary, so that an HBM tier allocated a whole number
    of rows from them (`rows_aligned_with`) keeps its rows aligned too where a row's bytes
    divide 4 KiB. The whole buffer is registered from its storage's start: torch's `is_pinned`
    asks about the storage's first byte, and a tensor it does not see as pinned gets copied
    into torch's pinned allocator (`PlacedTables._install`), tens of GB each time."""
    nbytes = rows * dim * torch.empty(0, dtype=dtype).element_size()
    buf = pinned_host_buffer(nbytes + 4096, mapped=True)
    skip = -buf.data_ptr() % 4096
    return buf[skip:skip + nbytes].view(dtype).view(rows, dim)


@dataclass
class Staged:
    """One batch's copied-ahead rows: the staging rows (the distinct rows the batch reads from
    COPY blocks, then one zero row, the pad), and for every index of the batch (all tables, in
    order) its row in them: the pad for the indices whose block is not COPY."""

    rows: torch.Tensor
    slots: torch.Tensor


@dataclass(frozen=True)
class _Layout:
    """Per shape of batch (indices and bags per table), built once on the device: each index's
    table's first global block and first row, and each bag offset's shift into the concatenated
    indices."""

    table_block: torch.Tensor  # per index
    table_row: torch.Tensor  # per index: its table's first row in the host tier
    bag_shift: torch.Tensor  # per bag
    host_table_block: np.ndarray  # table_block on the host (for `prefetch`)
    bags: tuple[int, ...]  # bags per table (to split the pooled rows)
    total: int  # indices in the batch


class PlacedTables:
    """Tables of one width looked up together (as table-batched embeddings are), each table's
    blocks of `block_rows` rows placed by its codes in `where`. The host tier keeps every row of
    every table (one pinned tensor, the tables one after another); HBM keeps copies of the
    resident blocks (one device tensor, then one zero row: the pad).

    The block maps are built once, here, on the device: per global block its code and its
    *slot base* (its first row in its tier's storage, less its first row in its table), so that
    an index's row in its tier is ``slot_base[block] + index``; and, once the tiers exist, the
    same in the unified view over both (``unified_base``). A lookup is then a fixed number of
    device kernels whatever the number of tables, with no host synchronization (`lookup`)."""

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
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        base = first.copy()
        base[fast] = np.cumsum(sizes[fast]) - sizes[fast]
        self.block_start = np.concatenate([[0], np.cumsum(nb)[:-1]]).astype(np.int64)
        self.table_row = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        within_table = (np.arange(len(codes)) - np.repeat(self.block_start, nb)) * block_rows
        self.row_fast = np.repeat(fast, sizes)
        self.fast_rows = int(sizes[fast].sum())
        self.tiers = frozenset(int(c) for c in np.unique(codes))
        # the host tier's pad: the first row of a block never read from the host tier (its
        # index there is never a real one); none is needed when every block is HOST
        other = np.flatnonzero(codes != HOST)
        self.host_pad = int(first[other[0]]) if len(other) else 0
        self.code = torch.as_tensor(codes.astype(np.int64), device=self.device)
        self.slot_base = torch.as_tensor(base - within_table, device=self.device)
        self.host_code_np = codes  # for `prefetch`, on the host: rows in the host tier
        self.host_slot_base_np = first - within_table
        self.fast_base_np = base - within_table  # HBM blocks: rows in the HBM tier
        self._layouts: dict[tuple[tuple[int, ...], tuple[int, ...], str], _Layout] = {}

    def _install(self, host: torch.Tensor, resident: torch.Tensor | None) -> PlacedTables:
        """Every row in `host` (pinned here on CUDA); the HBM tier made, `resident` (the
        resident rows, on the host) copied into it or, if None, left unset; then the unified
        view over both tiers (None where it cannot be made: `lookup` then pools per tier)."""
        if self.device.type == "cuda":
            if not host.is_pinned():
                host = host.pin_memory()
            fast = rows_aligned_with(host, self.fast_rows + 1, self.dim, self.device)
        else:  # one buffer, host rows then HBM rows: the CPU's unified view (a copy)
            both = torch.empty(host.shape[0] + self.fast_rows + 1, self.dim, dtype=host.dtype)
            both[:host.shape[0]] = host
            host, fast = both[:host.shape[0]], both[host.shape[0]:]
        if resident is not None:
            fast[:self.fast_rows].copy_(resident)
        fast[self.fast_rows:].zero_()
        self.fast, self.host = fast, host
        self.host_view = zero_copy_view(host, self.device)
        self.unified: torch.Tensor | None = None
        if self.device.type == "cuda":
            made = unified_view([host, fast], self.device)
        else:
            made = both, [0, host.shape[0]]
        if made is not None:
            self.unified, (host_at, fast_at) = made
            # per block, its first row in the unified view less its first row in its table;
            # COPY blocks are pointed at the HBM tier's zero row by `lookup`
            base = np.where(self.host_code_np == HBM, fast_at + self.fast_base_np,
                            host_at + self.host_slot_base_np)
            self.unified_base = torch.as_tensor(base, device=self.device)
            self.unified_pad = fast_at + self.fast_rows
        return self

    @classmethod
    def from_weights(cls, weights: list[torch.Tensor], where: list[np.ndarray],
                     block_rows: int, device: str | torch.device = "cpu") -> PlacedTables:
        """The tables' `weights` (on the host): all rows in host memory, resident blocks
        copied to HBM."""
        tables = cls([w.shape[0] for w in weights], weights[0].shape[1], where, block_rows,
                     device)
        host = torch.cat(weights).contiguous()
        return tables._install(host, host[torch.as_tensor(tables.row_fast)])

    @classmethod
    def uninitialized(cls, rows: list[int], dim: int, where: list[np.ndarray],
                      block_rows: int, device: str | torch.device = "cpu",
                      host: torch.Tensor | None = None) -> PlacedTables:
        """Tiers of the right sizes, values unset (timing tables too big to fill); `host`: a
        host tier to share between placements (on the CPU it is copied into the tables'
        buffer)."""
        tables = cls(rows, dim, where, block_rows, device)
        if host is None:
            host = pinned_empty(sum(rows), dim) if tables.device.type == "cuda" else \
                torch.empty(sum(rows), dim)
        return tables._install(host, None)

    def layout(self, lengths: list[int], bags: list[int]) -> _Layout:
        """The device tensors for a batch of `lengths` indices and `bags` bags per table, made
        the first time that shape is seen (host work once, not per batch)."""
        key = (tuple(lengths), tuple(bags), self.device.type)
        if key not in self._layouts:
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            table_block = np.repeat(self.block_start, lengths)
            self._layouts[key] = _Layout(
                torch.as_tensor(table_block, device=self.device),
                torch.as_tensor(np.repeat(self.table_row, lengths), device=self.device),
                torch.as_tensor(np.repeat(starts, bags), device=self.device),
                table_block, tuple(bags), int(sum(lengths)))
        return self._layouts[key]

    @property
    def copies_ahead(self) -> bool:
        return COPY in self.tiers

    def prefetch(self, indices: list[torch.Tensor], non_blocking: bool = True,
                 ) -> Staged | None:
        """Copy ahead the distinct rows of COPY blocks that the batch's `indices` (on the
        host) read; None, at once, if the placement copies nothing ahead. This is the one
        per-batch host step, by design: the host gathers the rows it sends (a deployment does it
        for batch k+1, on a side stream, while batch k runs)."""
        if not self.copies_ahead:
            return None
        lay = self.layout([len(ix) for ix in indices], [0] * len(indices))
        flat = np.concatenate([ix.cpu().numpy() for ix in indices]).astype(np.int64, copy=False)
        block = flat // self.block_rows + lay.host_table_block
        copied = np.flatnonzero(self.host_code_np[block] == COPY)
        unique, inverse = np.unique(self.host_slot_base_np[block[copied]] + flat[copied],
                                    return_inverse=True)
        pin = self.device.type == "cuda"  # numpy below: torch's CPU ops wake its threads
        rows = torch.empty(len(unique) + 1, self.dim, dtype=self.host.dtype, pin_memory=pin)
        np.take(self.host.numpy(), unique, axis=0, out=rows.numpy()[:-1])
        rows.numpy()[-1] = 0  # the pad
        slots = torch.empty(len(flat), dtype=torch.long, pin_memory=pin)
        slots.numpy().fill(len(unique))
        slots.numpy()[copied] = inverse.reshape(-1)
        return Staged(rows.to(self.device, non_blocking=non_blocking),
                      slots.to(self.device, non_blocking=non_blocking))

    def lookup(self, indices: list[torch.Tensor], offsets: list[torch.Tensor], *,
               mode: str = "sum", staged: Staged | None = None,
               padded: bool = False) -> list[torch.Tensor]:
        """Per table, ``embedding_bag(indices[t], table t, offsets[t], mode)`` (sum or mean).

        Device kernels only, a fixed number of them for any number of tables: concatenate the
        indices and offsets (shifted by the cached layout), map every index to its row in the
        unified view of the HBM and host tiers (its block, then one gather from the block map;
        a copied-ahead index to the HBM tier's zero row), pool them with one
        ``embedding_bag``, then the staged rows with another, and add. `padded`: instead, one
        ``embedding_bag`` per tier with the other tiers' indices at that tier's pad, as the
        first executor did (kept to measure against: on CUDA its host-tier kernel reads the
        host pad row over the link once per lookup served elsewhere); also the path taken
        where the unified view could not be made. Pass the indices and offsets on the device:
        nothing here waits for the device."""
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode {mode!r}: sum or mean")
        if self.copies_ahead and staged is None:
            raise ValueError("the placement copies blocks ahead: prefetch the batch first")
        lay = self.layout([len(ix) for ix in indices], [len(off) for off in offsets])
        dev = self.device
        flat = torch.cat(indices).to(dev, torch.long, non_blocking=True)
        bags = torch.cat(offsets).to(dev, torch.long, non_blocking=True) + lay.bag_shift
        pooled = None
        if self.tiers == {HBM} or self.tiers == {HOST}:  # one tier, every row in table order
            weight = self.fast if HBM in self.tiers else self.host_view
            pooled = F.embedding_bag(flat + lay.table_row, weight, bags, mode="sum")
        elif self.tiers & {HBM, HOST}:
            block = torch.div(flat, self.block_rows, rounding_mode="floor") + lay.table_block
            if self.unified is not None and not padded:
                row = self.unified_base[block] + flat
                if COPY in self.tiers:
                    row = torch.where(self.code[block] == COPY, self.unified_pad, row)
                pooled = F.embedding_bag(row, self.unified, bags, mode="sum")
            else:
                slot = self.slot_base[block] + flat
                code = self.code[block]
                for tier, weight, pad in ((HBM, self.fast, self.fast_rows),
                                          (HOST, self.host_view, self.host_pad)):
                    if tier in self.tiers:
                        part = F.embedding_bag(torch.where(code == tier, slot, pad), weight,
                                               bags, mode="sum", padding_idx=pad)
                        pooled = part if pooled is None else pooled.add_(part)
        if staged is not None:
            if len(staged.slots) != lay.total:
                raise ValueError("staged rows of another batch")
            part = F.embedding_bag(staged.slots, staged.rows, bags, mode="sum",
                                   padding_idx=len(staged.rows) - 1)
            pooled = part if pooled is None else pooled.add_(part)
        assert pooled is not None
        if mode == "mean":
            ends = torch.cat([bags[1:], bags.new_full((1,), lay.total)])
            pooled = pooled / (ends - bags).clamp_(min=1).unsqueeze(1).to(pooled.dtype)
        return list(pooled.split(list(lay.bags)))


def _block_sizes(rows: int, block_rows: int) -> np.ndarray:
    sizes = np.full(-(-rows // block_rows), block_rows, dtype=np.int64)
    sizes[-1] = rows - block_rows * (len(sizes) - 1)
    return sizes
