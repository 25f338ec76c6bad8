"""The source cost model calibrated at warm-up (SRC-3, program/calibrate.py): its structure,
floors and injection, and the order it gives at Qwen3-Next sizes against the old fixed default.

No assertion here is on a measured time: the measuring functions run on stand-in pools and
clocks, and the order tests inject rates.
"""
import math

import numpy as np
import pytest

import ledger as L
from ledger.simulate import CacheSim, SavePoint, small_config
from ninfer_jax.program import calibrate
from ninfer_jax.program.calibrate import CostRates

# Qwen3-Next-80B-A3B geometry in bf16 (its config.json: 48 layers, every fourth gated full
# attention with 2 KV heads of 256; 36 Gated DeltaNet layers with 16 key / 32 value heads of 128,
# conv kernel 4, float32 recurrent state; hidden 2048). tests/engine/test_engine_cost_model.py
# derives the same two figures from a ModelConfig.
KV_PER_TOKEN = 2 * 12 * 2 * 256 * 2  # 24 KiB
STATE_IMAGE = 36 * (3 * (2 * 16 * 128 + 32 * 128) * 2 + 4 * 32 * 128 * 128) + 2048 * 2  # ≈ 73.7 MiB

# Prefill of the 80B-A3B model on one H200-class GPU, per token at up to 32k context: about 3B
# active parameters (≈ 6 GFLOP/token) plus 12 attention layers over a ~16k mean causal context
# (≈ 3 GFLOP/token), at 10-30 % of ~1 PFLOP/s bf16 (512 small experts run well below peak):
# 3e-5 .. 1e-4 s/token. H2D from pinned Host memory over PCIe Gen5 x16: 20 .. 50 GB/s. Both ends
# of both ranges are tested.
QWEN_RATES = [CostRates(p, h, h, 1e12) for p in (3e-5, 1e-4) for h in (20e9, 50e9)]


def test_src3_rates_map_to_the_ledger_cost_model_in_seconds():
    r = CostRates(5e-5, 25e9, 20e9, 1e12, True, "warmup", 0.01)
    assert r.ledger() == L.CostModel(5e-5, 1 / 25e9, 1 / 1e12)
    assert r.copy_out_and_back_s(10**9) == pytest.approx(1 / 25 + 1 / 20)
    assert r.recompute_s(1000) == pytest.approx(0.05)
    s = r.stats()
    assert s["prefill_s_per_token"] == 5e-5 and s["h2d_bytes_per_s"] == 25e9 and s["d2h_bytes_per_s"] == 20e9
    assert s["calibrated"] is True and s["source"] == "warmup"
    assert s["ledger"] == r.ledger()._asdict()
    # The ledger's fixed default read as seconds gives the ledger's default back (the old behaviour).
    d = calibrate.DEFAULT.ledger()
    assert d == pytest.approx(L.CostModel()) and not calibrate.DEFAULT.calibrated
    assert calibrate.DEFAULT.source == "default"


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1"])
def test_src3_rates_must_be_positive_finite(bad):
    for i in range(4):
        fields = [5e-5, 25e9, 25e9, 1e12]
        fields[i] = bad
        with pytest.raises(ValueError):
            calibrate.checked(CostRates(*fields))


def test_src3_environment_switch():
    assert calibrate.from_env("") == ("warmup", {})
    assert calibrate.from_env("warmup") == ("warmup", {})
    assert calibrate.from_env("off") == ("off", {})
    assert calibrate.from_env("prefill_s_per_token=5e-5, h2d_bytes_per_s=2.5e10") == (
        "set", {"prefill_s_per_token": 5e-5, "h2d_bytes_per_s": 2.5e10})
    for bad in ("prefill=1", "h2d_bytes_per_s", "h2d_bytes_per_s=fast"):
        with pytest.raises(ValueError):
            calibrate.from_env(bad)


# ---- measuring on stand-ins ------------------------------------------------------------------
class _Pool:
    """A unit pool's byte movers without a device: enough for measure_moves."""

    def __init__(self, capacity, unit_bytes):
        self.capacity, self.unit_bytes = capacity, unit_bytes
        self.data = np.arange(capacity * unit_bytes, dtype=np.uint32).astype(np.uint8).reshape(capacity, unit_bytes)
        self.tree = {"x": self.data}
        self.calls = []

    def read_units(self, units):
        self.calls.append(("read", len(units)))
        return self.data[list(units)].copy()

    def write_units(self, units, data):
        self.calls.append(("write", len(units)))
        self.data[list(units)] = data

    def copy_units(self, src, dst):
        self.calls.append(("copy", len(src)))
        self.data[list(dst)] = self.data[list(src)]


class _Program:
    def __init__(self, progress=False):
        self.chunk_size = 32
        self.capacity = type("Cap", (), {"pages_per_request": 4})()
        self.config = type("Cfg", (), {"progress": progress})()
        self.stores = type("Stores", (), {})()
        self.stores.pools = {L.MAIN_KV: _Pool(128, 256), L.STATE_POOL: _Pool(8, 1024)}
        self.runs = []

    def _run(self, kind, *args):
        self.runs.append((kind, args))
        return np.zeros((1, 8), np.float32)


def test_src3_calibration_times_the_warmup_bucket_and_byte_movers_and_changes_no_bytes():
    prog = _Program()
    before = {k: p.data.copy() for k, p in prog.stores.pools.items()}
    r = calibrate.calibrate(prog, env="")
    assert r.calibrated and r.source == "warmup" and r.seconds > 0
    for f in calibrate.FIELDS:
        assert 0 < getattr(r, f) < math.inf
    # The padding row of the warm-up bucket: one chunk_size row, slot -1 (writes nothing).
    assert len(prog.runs) == calibrate.PREFILL_RUNS
    kind, (tokens, start, lengths, table, slots) = prog.runs[0]
    assert kind == "prefill" and tokens.shape == (1, 32) and table.shape == (1, 4) and slots.tolist() == [-1]
    # One unit and the largest compiled batch of each pool; every unit keeps its bytes.
    kv = prog.stores.pools[L.MAIN_KV]
    assert {n for op, n in kv.calls if op == "write"} == {1, calibrate.MOVE_MAX_UNITS}
    for k, p in prog.stores.pools.items():
        assert np.array_equal(p.data, before[k])


def test_src3_a_clock_that_stands_still_or_runs_back_cannot_give_zero_or_negative_prices(monkeypatch):
    prog = _Program()
    ticks = iter(range(10**6, 0, -1))  # perf_counter going backwards
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: float(next(ticks)))
    r = calibrate.calibrate(prog, env="")
    assert r.prefill_s_per_token == calibrate.MIN_SECONDS / prog.chunk_size
    for f in ("h2d_bytes_per_s", "d2h_bytes_per_s", "d2d_bytes_per_s"):
        assert 0 < getattr(r, f) <= calibrate.MAX_BYTES_PER_S
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: 5.0)  # standing still
    r = calibrate.calibrate(prog, env="")
    assert all(0 < getattr(r, f) < math.inf for f in calibrate.FIELDS)
    assert all(0 < v < math.inf for v in r.ledger())


def test_src3_injection_by_environment_measures_only_what_it_leaves_out(capsys):
    prog = _Program(progress=True)
    full = "prefill_s_per_token=5e-5,h2d_bytes_per_s=2.5e10,d2h_bytes_per_s=2e10,d2d_bytes_per_s=1e12"
    r = calibrate.calibrate(prog, env=full)
    assert r == CostRates(5e-5, 2.5e10, 2e10, 1e12, False, "env") and not prog.runs
    assert calibrate.calibrate(prog, env="off") is calibrate.DEFAULT and not prog.runs
    assert capsys.readouterr().err == ""  # nothing measured, nothing announced
    r = calibrate.calibrate(prog, env="h2d_bytes_per_s=3e10")
    assert r.h2d_bytes_per_s == 3e10 and r.source == "warmup+env" and r.calibrated and prog.runs
    line = capsys.readouterr().err
    assert line.startswith("[ninfer] calibrated: prefill ") and "µs/token, H2D 30 GB/s, D2H " in line


@pytest.mark.parametrize("host", ["room", "none", "occupied"])
def test_src3_real_stores_movers_are_timed_without_changing_a_byte_or_compiling(host):
    """The stores' own transfers through the Host arena (or, with no room there or with any
    Host extent allocated, the pools' movers), on real device pools holding real values."""
    import jax

    from ninfer_jax.program import ProgramStores, main_kv_pool, state_image_pool

    kv, st = main_kv_pool(8, 2, 2, 4), state_image_pool(3, 2, 4, 6, 2, 3, 5, 7)
    stores = ProgramStores([kv, st], 10 * kv.unit_bytes + 2 * st.unit_bytes if host != "none" else 0)
    rng = np.random.default_rng(0)
    for pool in stores.pools.values():
        pool.warm_up()
        pool.write_units(range(pool.capacity), rng.integers(0, 255, (pool.capacity, pool.unit_bytes), np.uint8))
    arena = None
    if host == "occupied":  # one page demoted to Host: its replica must stay as it is
        alloc = L.plan_allocate(stores.state, L.MAIN_KV, 1, "rec")
        stores.commit(alloc)
        oid = alloc.proof.allocated[0][0]
        p = L.plan_begin_transfer(stores.state, L.TransferRequest(L.TxnKind.DEMOTION, "t", [oid], L.HOST_MEDIUM))
        stores.commit(p)
        for step in (L.plan_submit, L.plan_complete, L.plan_publish):
            stores.commit(step(stores.state, p.proof.generation))
        stores.wait()
        arena = stores.arena.buf.copy()
    before = {k: p.read_units(range(p.capacity)) for k, p in stores.pools.items()}
    compiled = {k: len(p.compilations) for k, p in stores.pools.items()}
    d2h_before = stores.transfers.stats["d2h_transfers"]
    rates = calibrate.measure_moves(stores)
    assert all(0 < r <= calibrate.MAX_BYTES_PER_S for r in rates)
    for k, p in stores.pools.items():
        jax.block_until_ready(p.tree)
        assert np.array_equal(p.read_units(range(p.capacity)), before[k]), k
        assert len(p.compilations) == compiled[k], k
    assert not stores.transfers.pending
    assert (stores.transfers.stats["d2h_transfers"] > d2h_before) == (host == "room")  # the arena path
    if arena is not None:
        assert np.array_equal(stores.arena.buf, arena)
        stores.check_integrity()


def test_sim_rates_are_the_modelled_chunk_time_over_its_tokens():
    r = calibrate.sim_rates(2e-3, 2e-5, 64, 25e9, 20e9, 1e12)
    assert r.prefill_s_per_token == pytest.approx((2e-3 + 64 * 2e-5) / 64)
    assert (r.h2d_bytes_per_s, r.d2h_bytes_per_s, r.source, r.calibrated) == (25e9, 20e9, "sim", False)


# ---- the order at Qwen3-Next sizes ----------------------------------------------------------------
def test_src3_qwen3_next_break_even_old_default_vs_calibrated():
    old = L.CostModel()
    # Old default: a token's KV read back (24 KiB × 1e-4) costs 2.5 tokens of prefill, so a
    # source whose KV lies on Host never wins; a Host StateImage alone needs ~7.7k tokens.
    assert calibrate.host_break_even_tokens(old, STATE_IMAGE, KV_PER_TOKEN) == math.inf
    assert 7_700 < calibrate.host_break_even_tokens(old, STATE_IMAGE, KV_PER_TOKEN, kv_on_host=False) < 7_800
    for r in QWEN_RATES:  # calibrated: a few tens to a few hundred tokens
        n = calibrate.host_break_even_tokens(r.ledger(), STATE_IMAGE, KV_PER_TOKEN)
        assert 10 < n < 200, (r, n)
        assert calibrate.host_break_even_tokens(r.ledger(), STATE_IMAGE, KV_PER_TOKEN, kv_on_host=False) < n


PROMPT = 4096  # a long shared prefix: 64 Main KV pages


def _host_resident_history(cost: L.CostModel) -> tuple[CacheSim, list[int]]:
    """A finished request's points (P at the prompt end, E after it), every object demoted to
    the Host arena (no Device replica left), at Qwen3-Next-80B-A3B byte sizes."""
    page = KV_PER_TOKEN * L.PAGE_TOKENS
    sim = CacheSim(small_config(128, 4, 1 << 30, page, STATE_IMAGE), chunk=512, cost=cost, check=True)
    prompt = list(range(PROMPT))
    sim.run("a", prompt, saves=[SavePoint(PROMPT, L.PointKind.INPUT, L.InputKind.RAW)], output=(7, 8))
    oids = sorted({o for c in sim.cache.checkpoints.values() for o in c.object_ids()})
    sim.apply(L.plan_begin_transfer(sim.state, L.TransferRequest(L.TxnKind.DEMOTION, "t", oids, L.HOST_MEDIUM,
                                                                 drop_source=True)))
    sim.drive_transaction()
    assert all(sim.state.objects[o].device is None and sim.state.objects[o].host is not None for o in oids)
    return sim, prompt


@pytest.mark.parametrize("rates", QWEN_RATES, ids=lambda r: f"{r.prefill_s_per_token:g}s-{r.h2d_bytes_per_s:g}Bps")
def test_src3_host_source_beats_recompute_at_qwen3_next_sizes_with_calibrated_rates(rates):
    follow_up = list(range(PROMPT)) + [9000 + i for i in range(100)]
    sim, prompt = _host_resident_history(rates.ledger())
    q = L.SourceQuery("b", L.identity_of(follow_up))
    best = L.query_sources(sim.state, sim.cache, q, rates.ledger())[0]
    assert best.frontier == PROMPT and best.missing and best.transfer_bytes > 64 * KV_PER_TOKEN * L.PAGE_TOKENS
    old = L.query_sources(sim.state, sim.cache, q, L.CostModel())
    assert old[0].takeover == "root"  # the old default recomputes all 4,196 tokens instead
    assert {c.cid for c in old} == {c.cid for c in L.query_sources(sim.state, sim.cache, q, rates.ledger())}
    # And the bind really happens: the Host copy is read back and the prefix reused.
    got = sim.run("b", follow_up)
    assert got.reused == PROMPT and got.prefill == 100


def test_src3_old_default_gives_no_host_hit_at_qwen3_next_sizes():
    sim, prompt = _host_resident_history(L.CostModel())
    got = sim.run("b", prompt + [9000 + i for i in range(100)])
    assert got.reused == 0 and got.source == "root"
