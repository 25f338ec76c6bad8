"""The engine uses the cost model calibrated at warm-up (SRC-3, PAUSE-2): `stats()` reports it,
source order and the auto pause route read it, and on Qwen3-Next-sized content it makes the
Host tier pay where the old fixed default priced it out.

No assertion is on a measured time: the real engine's calibrated figures are checked for
structure and sign only; the order tests inject rates.
"""
import dataclasses
import math
import os

import pytest

import ledger
from engine_helpers import make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.model.config import FULL, LINEAR, ModelConfig
from ninfer_jax.program import calibrate
from ninfer_jax.program.calibrate import CostRates
from ninfer_jax.program.program import Program
from ninfer_jax.sim import SimProgram


# ---- the real engine on the built-in model ----------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_model):
    # The suite runs with NINFER_COST_MODEL=off (tests/conftest.py: measured prices would make
    # source order and pause routes vary run to run); this engine calibrates as a user's does.
    saved = os.environ.get(calibrate.ENV)
    os.environ[calibrate.ENV] = "warmup"
    try:
        return make_engine(tiny_model)
    finally:
        if saved is None:
            del os.environ[calibrate.ENV]
        else:
            os.environ[calibrate.ENV] = saved


def test_src3_stats_report_the_calibrated_model_and_reuse_uses_it(engine):
    got = engine.stats()["cost_model"]
    assert got["calibrated"] is True and got["source"] == "warmup"
    for f in calibrate.FIELDS:
        assert isinstance(got[f], float) and 0 < got[f] < math.inf, (f, got)
    assert isinstance(got["seconds"], float)  # how long calibrating took: reported, never bounded here
    rates = engine.program.cost_model
    assert engine.core.reuse.rates is rates
    assert engine.core.reuse.cost == rates.ledger() == CostRates(*(got[f] for f in calibrate.FIELDS)).ledger()
    assert got["ledger"] == engine.core.reuse.cost._asdict()
    # Calibration runs what warm-up compiled: calibrating again compiles nothing.
    compiled = engine.program.compilations
    again = calibrate.calibrate(engine.program, env="warmup")
    assert engine.program.compilations == compiled and again.calibrated


def test_src3_injected_or_switched_off_cost_model_replaces_calibration(engine, monkeypatch, capsys):
    cfg = engine.config
    mine = CostRates(5e-5, 25e9, 25e9, 1e12)
    e = Engine(cfg, program=Program(cfg, model=engine.program.model, steps=engine.program.steps), start=False,
               cost_model=mine)
    assert e.program.cost_model is mine and e.core.reuse.cost == mine.ledger()
    assert e.stats()["cost_model"]["source"] == "injected" and not e.stats()["cost_model"]["calibrated"]
    with pytest.raises(ValueError):
        Engine(cfg, program=Program(cfg, model=engine.program.model, steps=engine.program.steps), start=False,
               cost_model=mine._replace(h2d_bytes_per_s=0.0))
    monkeypatch.setenv(calibrate.ENV, "off")
    e = Engine(cfg, program=Program(cfg, model=engine.program.model, steps=engine.program.steps), start=False)
    assert e.stats()["cost_model"]["source"] == "default"
    assert e.core.reuse.cost == pytest.approx(ledger.CostModel())  # the behaviour before calibration
    monkeypatch.delenv(calibrate.ENV)
    capsys.readouterr()
    loud = dataclasses.replace(cfg, progress=True)
    Engine(loud, program=Program(loud, model=engine.program.model, steps=engine.program.steps), start=False)
    err = capsys.readouterr().err
    assert "[ninfer] calibrated: prefill " in err and " GB/s" in err


def test_src3_tokens_do_not_depend_on_the_cost_model(engine):
    """Calibration changes order only (SRC-3): with a Host-resident prefix, rates that price the
    Host tier in read it back, rates that price it out recompute from root; same tokens."""
    cfg = engine.config
    prompt, sp = list(range(5, 120)), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out, reused = [], []
    for rates in (CostRates(1e-3, 1e12, 1e12, 1e12), CostRates(1e-9, 1.0, 1.0, 1.0)):
        e = Engine(cfg, program=Program(cfg, model=engine.program.model, steps=engine.program.steps), start=False,
                   cost_model=rates)
        run_until_done(e, [e.submit(prompt[:100], sp)])
        _demote_everything(e)
        h = e.submit(prompt, sp)
        run_until_done(e, [h])
        out.append(h.result().token_ids)
        reused.append(h.result().usage.cached_tokens)
    assert reused[0] > 0 and reused[1] == 0
    assert out[0] == out[1]


# ---- Qwen3-Next sizes on the cost-model Program ------------------------------------------------
def qwen3_next_80b_a3b() -> ModelConfig:
    """The geometry of Qwen3-Next-80B-A3B (its config.json); the sim needs sizes only."""
    layers = tuple(FULL if i % 4 == 3 else LINEAR for i in range(48))
    return ModelConfig(model_type="qwen3_next", vocab_size=151936, hidden_size=2048, layer_types=layers,
                       num_attention_heads=16, num_key_value_heads=2, head_dim=256, rope_theta=1e7,
                       partial_rotary_factor=0.25, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                       mlp_types=("moe",) * 48, intermediate_size=5120, num_experts=512, num_experts_per_tok=10,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512, eos_token_id=(151645,))


# H200-class GPU: prefill ~5e-5 s/token at up to 32k context (tests/program/test_calibrate.py
# says how it is estimated), pinned H2D/D2H ~25 GB/s.
QWEN = CostRates(5e-5, 25e9, 25e9, 1e12)
SLOW_COPY = CostRates(5e-5, 1e9, 1e9, 1e12)  # an unpinned, contended link: copying loses to recompute


def _qwen_engine(rates: CostRates | None, **overrides) -> Engine:
    cfg = EngineConfig(**{"max_concurrency": 2, "max_context": 8192, "kv_capacity": 16384, "chunk_size": 512,
                          "dtype": "bfloat16", "progress": False,
                          "context_cache": ContextCacheConfig(host_capacity_bytes=1 << 30), **overrides})
    return Engine(cfg, program=SimProgram(cfg, qwen3_next_80b_a3b(), model_bytes=True), start=False,
                  cost_model=rates)


def test_qwen3_next_sizes_reach_the_ledger():
    e = _qwen_engine(QWEN)
    spec = {p.pool_id: p for p in e.program.state.config.pools}
    assert spec[ledger.MAIN_KV].unit_bytes == 24 * 1024 * ledger.PAGE_TOKENS  # 24 KiB per token
    assert spec[ledger.STATE_POOL].unit_bytes == 77_271_040  # ≈ 73.7 MiB per StateImage
    assert e.stats()["cost_model"]["source"] == "injected"
    # Without injection the sim's own model is used: its chunk time over its tokens, its copy rates.
    plain = Engine(e.config, program=SimProgram(e.config, qwen3_next_80b_a3b(), model_bytes=True), start=False)
    assert plain.stats()["cost_model"]["source"] == "sim" and plain.core.reuse.cost == plain.program.cost.rates(
        512).ledger()


def _demote_everything(e: Engine) -> None:
    """Move every cached object to the Host arena, dropping its Device replica."""
    state = e.program.state
    oids = sorted({o for c in e.core.reuse.cache.checkpoints.values() for o in c.object_ids()
                   if state.objects[o].device is not None})
    e.core.reuse.apply(ledger.plan_begin_transfer(state, ledger.TransferRequest(
        ledger.TxnKind.DEMOTION, "test", oids, ledger.HOST_MEDIUM, drop_source=True)))
    e.core.reuse.drive_transaction()
    e.check_integrity()


@pytest.mark.parametrize("rates, hit", [(QWEN, True), (calibrate.DEFAULT, False)], ids=["calibrated", "old-default"])
def test_src3_host_resident_prefix_is_reused_at_qwen3_next_sizes(rates, hit):
    e = _qwen_engine(rates)
    prompt = list(range(1, 4097))
    first = e.submit(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    run_until_done(e, [first])
    _demote_everything(e)
    before = e.stats()
    second = e.submit(prompt + [7000 + i for i in range(100)],
                      SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    run_until_done(e, [second])
    after = e.stats()
    reused = after["reused_tokens"] - before["reused_tokens"]
    read_back = after["h2d_bytes"] - before["h2d_bytes"]
    if hit:  # ~4 ms of reading 4096 tokens' KV and a StateImage back beats 0.2 s of prefill
        assert reused == 4096 and read_back >= 64 * 24 * 1024 * ledger.PAGE_TOKENS
    else:  # the old default: 2.5 prefill tokens per token of KV read back, so recompute all
        assert reused == 0 and read_back == 0
    assert second.result().usage.cached_tokens == reused


def _mid_prefill(e: Engine, tokens: int):
    h = e.submit(list(range(1, 4001)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    for _ in range(100):
        e.step()
        req = e.core.by_id.get(h.request_id)
        if req is not None and req.fed >= tokens:
            return h, req
    raise AssertionError("never reached the frontier")


@pytest.mark.parametrize("rates, route", [(QWEN, "snapshot"), (SLOW_COPY, "replay"), (calibrate.DEFAULT, "replay")],
                         ids=["cheap-copy", "slow-copy", "old-default"])
def test_pause2_auto_route_follows_the_cost_model(rates, route):
    """2048 tokens computed, nothing cached: Snapshot copies ~127 MB out and back (10 ms at
    25 GB/s, 0.25 s at 1 GB/s) against 0.1 s of recomputation (PAUSE-2, SRC-3)."""
    e = _qwen_engine(rates, pause_route="auto")
    h, req = _mid_prefill(e, 2048)
    assert e.core.preempt.choose_route(req) == route
    assert e.core.pause(h.request_id)  # the engine's own choice
    e.check_integrity()
    run_until_done(e, [h])
    stats = e.stats()
    assert stats[f"pauses_{route}"] == 1 and stats[f"resumes_{route}"] == 1
    assert h.result().finish_reason == "length"


def test_sim_logits_rows_hold_only_this_steps_picks():
    # issue 15: the kept logits buffer clears the previous step's picks element by element; a
    # stale 10 left in a row would make the engine emit another token
    import numpy as np

    e = _qwen_engine(QWEN)
    prog = e.program
    for picks in ([5, 7, 9], [7], [151935, 3, 3, 0], [2, 2]):
        out = prog._block(picks)
        want = np.zeros((len(picks), prog.vocab_size), np.float32)
        want[np.arange(len(picks)), picks] = 10.0
        assert out.shape == want.shape and np.array_equal(out, want) and not out.flags.writeable
        assert np.count_nonzero(prog._buf) == len(picks)  # nothing left from earlier steps
