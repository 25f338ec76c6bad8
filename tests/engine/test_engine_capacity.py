"""RES-6: a request that cannot get a legal unit even alone gets the capacity contract error,
never a hang — shown on the cost-model Program with a pool smaller than CFG-6 allows."""
import jax.numpy as jnp

import ledger
from engine_helpers import HOST
from ninfer_jax import Engine, EngineConfig, SamplingParams
from ninfer_jax.program.stores import ProgramStores
from ninfer_jax.program.unit_pool import UnitPool
from ninfer_jax.sim import SimProgram


def test_res6_capacity_contract_error_not_a_hang():
    cfg = EngineConfig(max_concurrency=1, max_context=256, chunk_size=64, progress=False, context_cache=HOST)
    program = SimProgram(cfg)
    # Two Main KV pages where one request may need four: a configuration CFG-6 forbids.
    program.stores = ProgramStores(
        [UnitPool(ledger.MAIN_KV, ledger.KV_PAGES, jnp.zeros((2, 1), jnp.uint8), 64),
         UnitPool(ledger.STATE_POOL, ledger.STATE_SLOTS, jnp.zeros((2, 1), jnp.uint8))], 1 << 20)
    engine = Engine(cfg, program=program, start=False)
    h = engine.submit(list(range(200)), SamplingParams(temperature=0, max_tokens=10))
    small = engine.submit([1, 2, 3], SamplingParams(temperature=0, max_tokens=4))
    for _ in range(50):
        engine.step()
        engine.check_integrity()
        if h.done() and small.done():
            break
    r = h.result(timeout=0)
    assert r.finish_reason == "error" and "RES-6" in r.error
    assert small.result(timeout=0).finish_reason == "length"
    assert engine.stats()["capacity_errors"] == 1
