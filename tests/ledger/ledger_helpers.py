"""Small ledgers and one-line steps for the ledger tests."""
from __future__ import annotations

from hypothesis import HealthCheck, settings

import ledger as L

# Fixed, derandomized profile: bounded examples, no deadline (the machine is shared).
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

PAGE = 1024
SLOT = 4096


def config(main=16, slots=4, backend=0, host=1 << 16, page=PAGE, slot=SLOT) -> L.LedgerConfig:
    pools = [L.PoolSpec(L.MAIN_KV, L.KV_PAGES, main, page, 64), L.PoolSpec(L.STATE_POOL, L.STATE_SLOTS, slots, slot)]
    if backend:
        pools.append(L.PoolSpec("backend_kv:mtp", L.KV_PAGES, backend, page // 2, 32))
    return L.LedgerConfig(tuple(pools), host)


def fresh(**kw) -> L.LedgerState:
    return L.initial_state(config(**kw))


def run(state: L.LedgerState, plan) -> L.LedgerState:
    """Commit a plan that must be a Plan, and check integrity after it."""
    assert isinstance(plan, L.Plan), plan
    new = L.commit(state, plan)
    L.check_integrity(new)
    return new


def alloc(state, n, holder="rec", pool=L.MAIN_KV):
    p = L.plan_allocate(state, pool, n, holder)
    return run(state, p), [a[0] for a in p.proof.allocated]


def transfer(state, oids, to, owner="txn", drop=False, kind=L.TxnKind.DEMOTION, group=64):
    p = L.plan_begin_transfer(state, L.TransferRequest(kind, owner, oids, to, drop_source=drop, page_group=group))
    state = run(state, p)
    g = p.proof.generation
    for step in (L.plan_submit, L.plan_complete, L.plan_publish):
        state = run(state, step(state, g))
    return state
