"""The Program's context stores: device pools, the Host arena buffer, and commit(plan).

`ProgramStores` is the only owner of these buffers and of the current ledger state. The
engine's `Program` builds on it: it asks `ledger` planners for plans against `stores.state`
and hands them to `stores.commit(plan)`, which
  1. applies the plan to the current ledger state (`ledger.commit`): when the state moved on
     since the plan was made, every precondition is re-checked and a stale plan raises
     `ledger.StalePlan` with nothing applied;
  2. moves the bytes the plan names (D2H, H2D, Device copy-on-write);
  3. installs the new ledger state.
Effects only write to destinations the old state does not expose (pending transfer
destinations, freshly allocated units), so a device error in step 2 leaves the old state
valid; it goes to the engine's failure cleanup (TXN-2).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

import ledger
from ledger import CopyToDevice, CopyToHost, CopyUnit, LedgerConfig, LedgerState, Plan
from ninfer_jax.program.host_arena import HostArenaBuffer
from ninfer_jax.program.unit_pool import UnitPool


class ProgramStores:
    def __init__(self, pools: Sequence[UnitPool], host_capacity_bytes: int):
        self.pools: dict[str, UnitPool] = {}
        for p in pools:
            if p.pool_id in self.pools:
                raise ValueError(f"duplicate pool id {p.pool_id!r}")
            self.pools[p.pool_id] = p
        self.arena = HostArenaBuffer(host_capacity_bytes)
        self.config = LedgerConfig(tuple(p.spec() for p in pools), host_capacity_bytes).validate()
        self._state = ledger.initial_state(self.config)

    @property
    def state(self) -> LedgerState:
        return self._state

    def commit(self, plan: Plan) -> LedgerState:
        """Apply a plan in one step (see module doc). Returns the new ledger state."""
        new = ledger.commit(self._state, plan)  # StalePlan: nothing applied, nothing moved
        if plan.effects:
            self._run(plan.effects)
        self._state = new
        return new

    def _run(self, effects) -> None:
        # Batch consecutive effects of one kind and pool: one gather or scatter per batch.
        i = 0
        while i < len(effects):
            e = effects[i]
            j = i + 1
            while j < len(effects) and type(effects[j]) is type(e) and effects[j].pool == e.pool:
                j += 1
            batch = effects[i:j]
            pool = self.pools[e.pool]
            if isinstance(e, CopyToHost):
                data = pool.read_units([x.unit for x in batch])
                for row, x in zip(data, batch):
                    self.arena.write(x.offset, row)
            elif isinstance(e, CopyToDevice):
                data = np.stack([self.arena.read(x.offset, x.nbytes) for x in batch])
                pool.write_units([x.unit for x in batch], data)
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
        if self.arena.buf.size != self.config.host_capacity_bytes:
            raise ledger.IntegrityError(f"arena buffer {self.arena.buf.size} B, ledger {self.config.host_capacity_bytes} B")
        return recount
