"""The Program's context stores: device pools, the Host arena buffer, and commit(plan).

`ProgramStores` is the only owner of these buffers and of the current ledger state. The
engine's `Program` builds on it: it asks `ledger` planners for plans against `stores.state`
and hands them to `stores.commit(plan)`, which
  1. applies the plan to the current ledger state (`ledger.commit`): when the state moved on
     since the plan was made, every precondition is re-checked and a stale plan raises
     `ledger.StalePlan` with nothing applied;
  2. dispatches the byte moves the plan names (D2H, H2D, Device copy-on-write) without
     waiting for them (program/transfers.py: one host copy each way);
  3. installs the new ledger state.
Effects only write to destinations the old state does not expose (pending transfer
destinations, freshly allocated units), so a device error in step 2 leaves the old state
valid; it goes to the engine's failure cleanup (TXN-2).

Copies in flight (TXN-1, SCH-9): the copies of a transaction's `submit` carry its generation;
`poll()` lands what is ready, `copies_done(generation)` says whether the transaction's copies
have all landed, and committing its `complete` first lands whatever is left (waiting: the
ledger must never hear "done" before the bytes are there). A plan's own effects (a capture
to Host, a fork read from Host) are complete in the ledger at once; their bytes land at the
next poll, and the arena's guard lands them first if anyone reads or reuses the region sooner.
Device-side order needs nothing: JAX orders every later step on a pool after the copies
dispatched on it, and a donated buffer is reused only after its readers ran.
"""
from __future__ import annotations

from typing import Sequence

import ledger
from ledger import CopyToDevice, CopyToHost, CopyUnit, LedgerConfig, LedgerState, Plan
from ninfer_jax.program.host_arena import HostArenaBuffer
from ninfer_jax.program.transfers import Transfers
from ninfer_jax.program.unit_pool import UnitPool


class ProgramStores:
    arena_cls = HostArenaBuffer  # what holds the Host bytes (the cost-model Program keeps none)

    def __init__(self, pools: Sequence[UnitPool], host_capacity_bytes: int):
        self.pools: dict[str, UnitPool] = {}
        for p in pools:
            if p.pool_id in self.pools:
                raise ValueError(f"duplicate pool id {p.pool_id!r}")
            self.pools[p.pool_id] = p
        self.arena = self.arena_cls(host_capacity_bytes)
        self.transfers = Transfers(self.arena)
        self.transfers.synchronous = self.host_side_copies
        self._generation = None  # the transaction whose submit is being run (its copies' tag)
        self.config = LedgerConfig(tuple(p.spec() for p in pools), host_capacity_bytes).validate()
        self._state = ledger.initial_state(self.config)

    @property
    def state(self) -> LedgerState:
        return self._state

    def commit(self, plan: Plan) -> LedgerState:
        """Apply a plan in one step (see module doc). Returns the new ledger state."""
        new = ledger.commit(self._state, plan)  # StalePlan: nothing applied, nothing moved
        if plan.kind == "complete" and plan.proof.generation is not None:
            self.transfers.finish(plan.proof.generation)  # TXN-2: the real copy ended first
        if plan.effects:
            self._generation = plan.proof.generation if plan.kind == "submit" else None
            try:
                self._run(plan.effects)
            finally:
                self._generation = None
        self._state = new
        return new

    # ---- copies in flight (module doc) ---------------------------------------------------
    def poll(self, tick: bool = True) -> int:
        """Land the copies that are ready; never waits."""
        return self.transfers.poll(tick)

    def copies_done(self, generation: int) -> bool:
        return self.transfers.done(generation)

    def wait(self, generation: int | None = None) -> None:
        """Land that transaction's copies (None: every copy), waiting for them."""
        self.transfers.finish(generation)

    @property
    def host_side_copies(self) -> bool:
        """Every pool lives in host memory (the CPU backend): a copy to the arena is a memcpy
        that ends within its dispatch, so waiting for it costs no more than polling it."""
        return all(getattr(p, "device", None) is None or p.device.platform == "cpu" for p in self.pools.values())

    def copies_held(self, generation: int) -> bool:
        """A test hold keeps one of that transaction's copies "not ready" (transfers.hold_polls)."""
        return any(t.held > 0 for t in self.transfers.in_flight(generation))

    def _run(self, effects) -> None:
        # Batch consecutive effects of one kind and pool: one transfer per batch.
        i = 0
        while i < len(effects):
            e = effects[i]
            j = i + 1
            while j < len(effects) and type(effects[j]) is type(e) and effects[j].pool == e.pool:
                j += 1
            batch = effects[i:j]
            pool = self.pools[e.pool]
            if isinstance(e, (CopyToHost, CopyToDevice)):
                bad = [x for x in batch if x.nbytes != pool.unit_bytes]
                if bad:
                    raise ValueError(f"pool {e.pool!r}: copies of {bad[0].nbytes} B, its units are {pool.unit_bytes} B")
                units, offsets = [x.unit for x in batch], [x.offset for x in batch]
                if isinstance(e, CopyToHost):
                    self.transfers.d2h(pool, units, offsets, self._generation)
                else:
                    self.transfers.h2d(pool, units, offsets, self._generation)
            elif isinstance(e, CopyUnit):
                pool.copy_units([x.src for x in batch], [x.dst for x in batch])
            else:
                raise TypeError(f"unknown effect {e!r}")
            i = j

    def check_integrity(self) -> ledger.Recount:
        """The ledger's first-principles recount, plus the buffers agreeing with the config."""
        recount = ledger.check_integrity(self._state)
        for spec in self.config.pools:
            pool = self.pools[spec.pool_id]
            if pool.spec() != spec:
                raise ledger.IntegrityError(f"pool {spec.pool_id!r} buffers {pool.spec()} differ from the ledger {spec}")
        if self.arena.capacity != self.config.host_capacity_bytes:
            raise ledger.IntegrityError(f"arena buffer {self.arena.capacity} B, ledger {self.config.host_capacity_bytes} B")
        return recount
