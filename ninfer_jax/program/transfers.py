"""Copies between the device pools and the Host arena: one host copy each way, dispatched
without waiting, landed when ready (TXN-1, SCH-9).

D2H (`CopyToHost`): the pool's compiled `pack` gathers the units straight into their Host
layout on device (uint8 `[k, unit_bytes]`), the bytes come to host memory, and one
`np.copyto` per contiguous arena run puts them in the arena's own bytes. Nothing else copies:
  CPU    a CPU array already is host memory: `np.asarray(packed)` is that buffer (zero-copy),
         so the copy into the arena is the only one.
  GPU    `jax.device_put(packed, <the device's pinned_host memory>)` is an asynchronous DMA into
         page-locked memory PJRT allocates (JAX 0.10/0.11 `memory_kind="pinned_host"`); the
         arena copy reads that memory in place. A backend without a pinned_host memory starts
         the DMA with `copy_to_host_async()` into PJRT's own host buffer instead.
H2D (`CopyToDevice`): `jax.device_put(<a zero-copy view of the arena region>, device,
may_alias=False)` reads the region once (on GPU PJRT stages it through its own pinned buffer
as part of that one read: JAX offers no DMA from a numpy buffer it did not allocate), then the
compiled `unpack` writes the units on device. Regions are split into power-of-two pieces so no
row is padded on the host (unit_pool.py).

The arena itself is a numpy buffer on every backend (host_arena.py): JAX has no writable
pinned array a numpy view could alias, so page-locking it would need the CUDA runtime directly.

Readiness: `jax.Array.is_ready()` on what each copy produces (the packed bytes on CPU, the
pinned or host-copied array on GPU, the uploaded rows for H2D); `poll()` lands whatever is
ready and never waits. A transfer that belongs to a context transaction carries its
generation; the engine asks `done(generation)` at its SCH-9 points. The blocking forms
(`finish`, and the arena guard for a region someone reads or overwrites while a copy over it
is in flight) wait, for callers that must have the bytes now.

Test hook: `hold_polls = n` keeps each transaction's copies "not ready" for their first n
polls (the real copy still runs), so tests can keep a transaction in flight across cycles.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import jax
import numpy as np

from ninfer_jax.program.host_arena import HostArenaBuffer
from ninfer_jax.program.unit_pool import UnitPool, pow2_pieces

PINNED_HOST = "pinned_host"


def runs(offsets: Sequence[int], unit_bytes: int) -> list[tuple[int, int]]:
    """Split positions 0..n-1 into (start, end) runs whose arena offsets are consecutive units."""
    out, start = [], 0
    for i in range(1, len(offsets) + 1):
        if i == len(offsets) or offsets[i] != offsets[i - 1] + unit_bytes:
            out.append((start, i))
            start = i
    return out


class HostPath:
    """How bytes cross between one device and host memory on this backend (module doc)."""

    def __init__(self, device):
        self.device = device
        self.platform = device.platform
        self.sharding = jax.sharding.SingleDeviceSharding(device)
        self.pinned = None
        if self.platform != "cpu":
            try:
                if PINNED_HOST in {m.kind for m in device.addressable_memories()}:
                    self.pinned = jax.sharding.SingleDeviceSharding(device, memory_kind=PINNED_HOST)
            except Exception:  # noqa: BLE001 - a backend without the memories API: plain host copies
                self.pinned = None

    @property
    def mode(self) -> str:
        if self.platform == "cpu":
            return "cpu"
        return "pinned_host" if self.pinned is not None else "copy_to_host_async"

    def to_host(self, packed: jax.Array) -> jax.Array:
        """Start moving device bytes to host memory; returns the array to read once ready."""
        if self.platform == "cpu":
            return packed  # already host memory
        if self.pinned is not None:
            return jax.device_put(packed, self.pinned)
        packed.copy_to_host_async()
        return packed

    def to_device(self, view: np.ndarray) -> jax.Array:
        """Start moving host bytes (a view of the arena) to the device."""
        try:
            return jax.device_put(view, self.sharding, may_alias=False)
        except TypeError:  # a JAX without may_alias: device_put of numpy copies anyway
            return jax.device_put(view, self.sharding)


@dataclasses.dataclass(eq=False)  # identity: a transfer is one dispatch
class Transfer:
    kind: str  # "d2h" | "h2d"
    generation: int | None  # the context transaction it belongs to; None: a plan's own effect
    arrays: list  # each must be ready before the transfer lands
    segments: list  # d2h: (array index, first row, end row, arena offset)
    regions: list  # arena [lo, hi) it writes (d2h) or reads (h2d)
    unit_bytes: int
    held: int = 0


class Transfers:
    """The copies in flight between the pools and one arena."""

    def __init__(self, arena: HostArenaBuffer):
        self.arena = arena
        arena.guard = self._guard
        self.pending: list[Transfer] = []
        self.hold_polls = 0  # test hook (module doc)
        # Pools in host memory (the CPU backend): a copy is a memcpy ending within its dispatch,
        # so a poll lands it rather than racing the copy thread, and a schedule is reproducible.
        self.synchronous = False
        self._paths: dict = {}
        self.stats = collections.Counter()  # d2h/h2d transfers, pieces, and host bytes copied

    def path(self, pool: UnitPool) -> HostPath:
        p = self._paths.get(pool.device)
        if p is None:
            p = self._paths[pool.device] = HostPath(pool.device)
        return p

    # ---- dispatch ---------------------------------------------------------------------------
    def d2h(self, pool: UnitPool, units: Sequence[int], offsets: Sequence[int], generation: int | None) -> None:
        ub = pool.unit_bytes
        spans = runs(offsets, ub)
        regions = [(offsets[a], offsets[b - 1] + ub) for a, b in spans]
        for lo, hi in regions:  # the region's earlier readers and writers first
            self._guard(lo, hi, True)
        path = self.path(pool)
        arrays, segments, at = [], [], 0
        for k in pow2_pieces(len(units)):
            arrays.append(path.to_host(pool.pack(units[at:at + k])))
            for a, b in spans:  # the rows of this piece, by contiguous arena run
                lo, hi = max(a, at), min(b, at + k)
                if lo < hi:
                    segments.append((len(arrays) - 1, lo - at, hi - at, offsets[a] + (lo - a) * ub))
            at += k
        self._push(Transfer("d2h", generation, arrays, segments, regions, ub))
        self.stats["d2h_transfers"] += 1
        self.stats["d2h_pieces"] += len(arrays)

    def h2d(self, pool: UnitPool, units: Sequence[int], offsets: Sequence[int], generation: int | None) -> None:
        ub = pool.unit_bytes
        path = self.path(pool)
        arrays, regions = [], []
        for a, b in runs(offsets, ub):
            lo, hi = offsets[a], offsets[b - 1] + ub
            self._guard(lo, hi, False)  # a copy still landing in this region lands first
            regions.append((lo, hi))
            at = a
            for k in pow2_pieces(b - a):
                view = self.arena.view(offsets[at], k * ub).reshape(k, ub)  # the arena's bytes, no copy
                rows = path.to_device(view)  # the one host-side copy
                pool.unpack(units[at:at + k], rows)
                arrays.append(rows)
                self.stats["h2d_host_bytes"] += k * ub
                at += k
        self._push(Transfer("h2d", generation, arrays, [], regions, ub))
        self.stats["h2d_transfers"] += 1
        self.stats["h2d_pieces"] += len(arrays)

    def _push(self, t: Transfer) -> None:
        if t.generation is not None:
            t.held = self.hold_polls
        self.pending.append(t)

    # ---- landing --------------------------------------------------------------------------
    @staticmethod
    def _ready(t: Transfer) -> bool:
        return all(a.is_ready() for a in t.arrays)

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)  # the one host copy of a D2H
        self.stats["d2h_host_bytes"] += dst.nbytes

    def _land(self, t: Transfer) -> None:
        """Finish one transfer (waits if it is not ready: callers poll first)."""
        if t.kind == "d2h":
            host = [np.asarray(a) for a in t.arrays]  # zero-copy on CPU and for pinned memory
            ub = t.unit_bytes
            for i, r0, r1, off in t.segments:
                self._copy(self.arena.view(off, (r1 - r0) * ub).reshape(r1 - r0, ub), host[i][r0:r1])
        else:
            jax.block_until_ready(t.arrays)
        self.pending.remove(t)

    def poll(self, tick: bool = True) -> int:
        """Land every transfer that is ready (and not held); never waits. Returns how many.
        `tick`: this poll counts against the test hold (one per SCH-9 point)."""
        landed = 0
        for t in list(self.pending):
            if t.held > 0:
                t.held -= tick
                continue
            if self.synchronous or self._ready(t):
                self._land(t)
                landed += 1
        return landed

    def done(self, generation: int) -> bool:
        """Every copy of that transaction has landed."""
        return not any(t.generation == generation for t in self.pending)

    def in_flight(self, generation: int | None = None) -> list[Transfer]:
        return [t for t in self.pending if generation is None or t.generation == generation]

    def finish(self, generation: int | None = None) -> None:
        """Land that transaction's copies (None: every copy) now, waiting for them."""
        for t in list(self.pending):
            if generation is None or t.generation == generation:
                self._land(t)

    def wait(self, generation: int) -> None:
        """Block until that transaction's copies are ready, without landing them (an engine
        with nothing else to do waits here instead of cycling)."""
        for t in self.pending:
            if t.generation == generation and not t.held:
                jax.block_until_ready(t.arrays)

    def _guard(self, lo: int, hi: int, write: bool) -> None:
        """Before the host touches [lo, hi): a D2H still landing there lands first; before it
        overwrites it, an H2D still reading it finishes."""
        for t in list(self.pending):
            if any(a < hi and lo < b for a, b in t.regions) and (t.kind == "d2h" or write):
                self._land(t)
