"""MTP speculative decoding in the engine (issue 17): with `speculative_tokens = k` every decode
row is a Verify unit, and the tokens are exactly those of decoding without drafts — greedy,
seeded sampling and forced outputs, at k = 1..4 and C = 1..8 with chunked prefill, for the
trained built-in model and the three architectures with a random MTP set; through cache hits of
every kind, Snapshot and Replay pauses between Verify units, and pools at their lower bounds
(doctrine 1, RES-1 Verify, CKP-1/2/3, PAUSE-6). The sampled tokens follow the target
distribution (a chi-square test)."""
from __future__ import annotations

import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, EngineConfig, SamplingParams
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.request import DECODE
from ninfer_jax.errors import ConfigError
from ninfer_jax.model import load_model
from ninfer_jax.model.config import load_config
from ninfer_jax.model.modules import HybridLM, init_params
from ninfer_jax.model.weights import hf_tensors
from ninfer_jax.program.program import Program

ORACLE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "oracle")
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def _prompts(n: int, seed: int, vocab: int = 1000, lo: int = 20, hi: int = 150):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _run(engine, work):
    handles = [engine.submit(p, sp) for p, sp in work]
    run_until_done(engine, handles)
    out = []
    for h in handles:
        got = h.result()
        assert got.finish_reason in ("length", "stop"), got.error
        out.append(got)
    return out


@pytest.fixture(scope="module")
def plain(tiny_model):
    """The reference: the same engine settings without drafts."""
    return make_engine(tiny_model, max_concurrency=2, max_context=256, chunk_size=16)


def _reference(plain, work):
    plain.clear_cache()
    return [r.token_ids for r in _run(plain, work)]


# (k, C): the default k at the largest bucket and another k alone; k = 1 and 4 (and C = 3, 4) are
# test_spec_three_architectures_equal_plain's, k = 4 under pressure test_spec_under_pressure_with_cancels'.
GREEDY_CASES = [(2, 8), (3, 1)]


@pytest.mark.parametrize("k, c", GREEDY_CASES, ids=[f"k{k}-C{c}" for k, c in GREEDY_CASES])
def test_spec_greedy_equals_plain_decode(tiny_model, plain, k, c):
    """Chunked prefill (16-token chunks over 20–150-token prompts), C + 2 requests so the batch
    shrinks and refills; the trained MTP head accepts drafts at every position."""
    work = [(p, GREEDY) for p in _prompts(c + 2, seed=k * 10 + c)]
    engine = make_engine(tiny_model, max_concurrency=c, max_context=256, chunk_size=16, speculative_tokens=k)
    got = _run(engine, work)
    assert [r.token_ids for r in got] == _reference(plain, work)
    stats = engine.stats()
    assert stats["spec_drafted_tokens"] > 0 and stats["spec_accepted_tokens"] > 0, stats
    by_pos = stats["spec_accepted_by_position"]
    assert len(by_pos) == k and sum(by_pos) == stats["spec_accepted_tokens"]
    assert all(a >= b for a, b in zip(by_pos, by_pos[1:]))  # draft j+1 is accepted only after draft j
    assert stats["spec_rejected_tokens"] == stats["spec_drafted_tokens"] - stats["spec_accepted_tokens"]
    assert stats["spec_mean_accepted_length"] == 1 + stats["spec_accepted_tokens"] / stats["spec_verify_units"]
    # Each Verify unit emits its accepted drafts plus one token of its own (max_tokens caps the
    # drafts, so none is cut short here); each request's first token comes from its prefill.
    assert stats["generated_tokens"] == len(work) + stats["spec_accepted_tokens"] + stats["spec_verify_units"]
    assert stats["decode_steps"] < sum(len(r.token_ids) - 1 for r in got)
    assert_idle_and_empty(engine)


def test_spec_seeded_sampling_and_logprobs_equal_plain(tiny_model, plain):
    """Temperature, top-k/top-p, penalties and logprobs: the same tokens and logprob entries as
    without drafts (the acceptance uniform is the position's own draw)."""
    rng = np.random.default_rng(4)
    sps = [SamplingParams(temperature=0.8, top_k=40, seed=7, max_tokens=24, ignore_eos=True, logprobs=3),
           SamplingParams(temperature=1.1, top_p=0.9, seed=8, max_tokens=24, ignore_eos=True,
                          repetition_penalty=1.2, presence_penalty=0.3),
           SamplingParams(temperature=0.5, min_p=0.05, seed=9, max_tokens=24, ignore_eos=True, frequency_penalty=0.4),
           SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)]
    work = [(rng.integers(0, 1000, int(rng.integers(20, 90))).tolist(), sp) for sp in sps]
    plain.clear_cache()
    want = _run(plain, work)
    engine = make_engine(tiny_model, max_concurrency=4, max_context=256, chunk_size=16, speculative_tokens=3)
    got = _run(engine, work)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert [(e.token_id, [t for t, _ in e.top]) for e in g.logprobs] == \
            [(e.token_id, [t for t, _ in e.top]) for e in w.logprobs]
        # The Verify unit's logits against the decode step's: float32 rounding apart.
        np.testing.assert_allclose([[e.logprob] + [x for _, x in e.top] for e in g.logprobs],
                                   [[e.logprob] + [x for _, x in e.top] for e in w.logprobs], atol=1e-4)
    assert engine.stats()["spec_accepted_tokens"] > 0


def test_spec_forced_output_and_stops(tiny_model, plain):
    """A forced output is emitted exactly (drafts equal to it are accepted); eos and stop ids end
    a Verify unit mid-way: the tokens after it are never emitted or fed, and E is published at
    the last emitted token (a later request extending it hits it)."""
    prompt = _prompts(1, seed=11)[0]
    plain.clear_cache()
    free = _run(plain, [(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))])[0].token_ids
    free = list(free)
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, chunk_size=16, speculative_tokens=4)
    forced = free[:10] + [5, 6, 7] + free[13:20]
    got = _run(engine, [(prompt, SamplingParams(forced_output=forced, max_tokens=64))])[0]
    assert list(got.token_ids) == forced and got.finish_reason == "stop"
    stop = free[7]
    first = free.index(stop) + 1
    got = _run(engine, [(prompt, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop]))])[0]
    assert list(got.token_ids) == free[:first] and got.finish_reason == "stop"
    follow = prompt + free[:first] + [3, 4, 5]
    before = engine.stats()["cache_hits"]
    got = _run(engine, [(follow, GREEDY)])[0]
    assert engine.stats()["cache_hits"] > before
    assert got.token_ids == _reference(plain, [(follow, GREEDY)])[0]
    assert_idle_and_empty(engine)


def _accepted(engine, work) -> tuple:
    """(tokens, drafts accepted) of one request run alone."""
    before = engine.stats()["spec_accepted_tokens"]
    tokens = _run(engine, work)[0].token_ids
    return tokens, engine.stats()["spec_accepted_tokens"] - before


CACHES = {"device": ContextCacheConfig(host_capacity_bytes=4 << 20),
          # no spare StateImage slot: points are demoted to Host between turns and read back
          "host": ContextCacheConfig(device_state_slots=0, host_capacity_bytes=4 << 20)}


@pytest.mark.parametrize("where", list(CACHES))
def test_spec_cached_equals_cold(tiny_model, plain, where):
    """Every source kind with drafts on: a shared system prompt (shared markers), a turn that
    extends the previous prompt and output (E), an exact repeat (a full hit sampling from the
    continuation hidden), greedy and seeded; on the device and through Host demotions. The MTP
    K/V travel in the adopted pages, so a request after a hit accepts exactly the drafts a cold
    run accepts (drafts computed from a page's MTP K/V: had they not travelled, the drafts and
    their acceptance would differ)."""
    rng = np.random.default_rng(12)
    system = rng.integers(0, 1000, 70).tolist()
    seeded = SamplingParams(temperature=0.9, top_k=50, seed=3, max_tokens=16, ignore_eos=True)
    engine = make_engine(tiny_model, max_concurrency=2, max_context=320, chunk_size=16, speculative_tokens=2,
                         context_cache=CACHES[where])
    cold = make_engine(tiny_model, max_concurrency=2, max_context=320, chunk_size=16, speculative_tokens=2,
                       context_cache=ContextCacheConfig(enabled=False))
    turns = []
    for i, sp in enumerate((GREEDY, seeded)):
        a = system + rng.integers(0, 1000, 30).tolist()
        out_a = list(_run(engine, [(a, sp)])[0].token_ids)
        b = a + out_a + rng.integers(0, 1000, 12).tolist()
        turns += [(a, sp), (b, sp), (a, sp), (system + rng.integers(0, 1000, 25).tolist(), sp)]
    got = [_accepted(engine, [(p, sp)]) for p, sp in turns]
    stats = engine.stats()
    assert stats["cache_hits"] >= 6 and stats["full_hits"] >= 2, stats
    if where == "host":
        assert stats["h2d_bytes"] > 0 and stats["d2h_bytes"] > 0, stats
    want = []
    for p, sp in turns:
        cold.clear_cache()
        want.append(_accepted(cold, [(p, sp)]))
    assert got == want
    assert sum(n for _, n in got) > 0
    plain.clear_cache()
    assert [t for t, _ in got] == [_run(plain, [(p, sp)])[0].token_ids for p, sp in turns]
    assert_idle_and_empty(engine)


@pytest.mark.parametrize("route", ["snapshot", "replay"])
def test_spec_pause_between_verify_units_equals_uninterrupted(tiny_model, plain, route):
    """PAUSE-6: drafts live inside one Verify unit, so a pause between cycles drops nothing but
    the row's binding; Snapshot brings back its pages (Main KV and MTP K/V), Replay recomputes
    both with the MTP prefill; both equal the uninterrupted run, and drafting resumes."""
    work = [(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)) for p in _prompts(3, seed=21)]
    work[1] = (work[1][0], SamplingParams(temperature=0.9, top_k=50, seed=5, max_tokens=24, ignore_eos=True))
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, chunk_size=16, speculative_tokens=4,
                         context_cache=ContextCacheConfig(host_capacity_bytes=4 << 20))
    handles = [engine.submit(p, sp) for p, sp in work]
    victim = handles[1]
    for _ in range(500):
        engine.step()
        engine.check_integrity()
        r = engine.core.by_id.get(victim.request_id)
        if r is not None and r.phase == DECODE and len(r.output) >= 6:
            break
    else:
        raise AssertionError("never reached mid-decode")
    accepted = engine.stats()["spec_accepted_tokens"]
    assert engine.core.pause(victim.request_id, route)
    engine.check_integrity()
    run_until_done(engine, handles)
    stats = engine.stats()
    assert stats[f"resumes_{route}"] >= 1 and stats["spec_accepted_tokens"] > accepted
    assert [h.result().token_ids for h in handles] == _reference(plain, work)
    assert_idle_and_empty(engine)


def test_spec_under_pressure_with_cancels(tiny_model):
    """Main KV just above its CFG-6 minimum, no spare StateImage slot, no Host arena, k = 4 (a
    Verify unit may need a page the others hold: pauses), cancels at every phase: integrity every
    cycle, and every finished request equals a cold engine without drafts."""
    rng = np.random.default_rng(31)
    system = rng.integers(0, 1000, 64).tolist()
    work = [(system + rng.integers(0, 1000, int(rng.integers(10, 100))).tolist(),
             SamplingParams(temperature=0 if i % 3 else 0.8, seed=i, max_tokens=int(rng.integers(8, 40)),
                            ignore_eos=True)) for i in range(10)]
    engine = make_engine(tiny_model, max_concurrency=3, max_context=192, chunk_size=16, speculative_tokens=4,
                         kv_capacity=256, context_cache=ContextCacheConfig(device_state_slots=0, host_capacity_bytes=0))
    handles = [engine.submit(p, sp) for p, sp in work]
    cancelled = set()
    cycles = 0
    while not all(h.done() for h in handles):
        engine.step()
        engine.check_integrity()
        cycles += 1
        if cycles in (3, 17, 40, 90):  # queued, prefilling, decoding: whichever the next one is
            live = [h for h in handles if not h.done() and h.request_id not in cancelled]
            if live:
                victim = live[cycles % len(live)]
                victim.cancel()
                cancelled.add(victim.request_id)
        assert cycles < 5000
    engine.step()
    cold = make_engine(tiny_model, max_concurrency=1, max_context=192, chunk_size=16,
                       context_cache=ContextCacheConfig(enabled=False))
    finished = 0
    for (p, sp), h in zip(work, handles):
        got = h.result()
        if h.request_id in cancelled and got.finish_reason == "cancelled":
            continue
        assert got.finish_reason == "length", got.error
        assert got.token_ids == _run(cold, [(p, sp)])[0].token_ids
        finished += 1
    assert finished >= 6 and engine.stats()["spec_accepted_tokens"] > 0
    assert_idle_and_empty(engine)


TEMP = 1.5  # a flat target: a sampler that keeps drafts too often piles its transforms up


def test_spec_sampling_follows_target_distribution(tiny_model):
    """Speculative sampling preserves the distribution: 400 seeded requests whose second token
    comes from a Verify unit (k = 2). Each token's randomized probability integral transform
    under the model's own distribution at that position (softmax of the float32 forward at
    the request's temperature) is uniform exactly when the tokens follow it: chi-square over 10 equal bins,
    9 degrees of freedom, fails above 27.88 (p = 0.001); the seeds are fixed, so the test is
    deterministic."""
    prompt = _prompts(1, seed=41, lo=30, hi=31)[0]
    engine = make_engine(tiny_model, max_concurrency=8, max_context=128, chunk_size=32, speculative_tokens=2,
                         context_cache=ContextCacheConfig(enabled=False))
    sps = [SamplingParams(temperature=TEMP, seed=1000 + i, max_tokens=3, ignore_eos=True) for i in range(400)]
    got = _run(engine, [(prompt, sp) for sp in sps])
    assert engine.stats()["spec_accepted_tokens"] > 0
    lm = HybridLM(tiny_model.config, tiny_model.params)
    last_logits = jax.jit(lambda t: lm(t)[0][-1])  # two context lengths: two compiles
    rng = np.random.default_rng(0)
    pit = []
    cache = {}
    for g in got:
        for j in (1, 2):  # tokens decided by Verify units
            ctx = tuple(prompt) + tuple(g.token_ids[:j])
            if ctx not in cache:
                z = np.asarray(last_logits(jnp.asarray(ctx, jnp.int32)), np.float64) / TEMP
                p = np.exp(z - z.max())
                cache[ctx] = p / p.sum()
            p = cache[ctx]
            t = g.token_ids[j]
            pit.append(p[:t].sum() + rng.random() * p[t])
    counts = np.histogram(pit, bins=10, range=(0, 1))[0]
    expected = len(pit) / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.88, (chi2, counts)


def test_spec_config_errors(tmp_path):
    """speculative_tokens outside 0..4, or a model without an MTP head: a ConfigError before any
    weight is loaded."""
    for bad in (-1, 5, 1.5, True):
        with pytest.raises(ConfigError, match="speculative_tokens"):
            EngineConfig(speculative_tokens=bad)
    folder = tmp_path / "no-mtp"
    shutil.copytree(os.path.join(ORACLE, "qwen3_next"), folder)
    os.remove(folder / "model.safetensors")  # never read: the config refuses first
    with pytest.raises(ConfigError, match="no MTP head"):
        Engine(EngineConfig(model=str(folder), speculative_tokens=2, progress=False), start=False)


def _random_mtp_folder(tmp_path, model_type: str) -> str:
    """A tiny oracle checkpoint with a complete random MTP set (one layer, HF names)."""
    src = os.path.join(ORACLE, model_type)
    raw = json.load(open(os.path.join(src, "config.json")))
    sub = raw.get("text_config", raw)
    sub["mtp_num_hidden_layers"] = 1
    folder = tmp_path / model_type
    folder.mkdir()
    json.dump(raw, open(folder / "config.json", "w"))
    cfg = load_config(str(folder))
    model = load_model(src, "float32")
    _, mtp = init_params(cfg, seed=5)
    from safetensors.numpy import save_file

    save_file(hf_tensors(jax_numpy(model.params), jax_numpy(mtp), cfg), str(folder / "model.safetensors"))
    return str(folder)


def jax_numpy(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float32), tree)


# Each architecture at its own (k, C), so that together they span k = 1, 3, 4 and C = 1, 3, 4
# (the trained model covers every k and C bucket above); one spec engine each.
ARCH_CASES = [("qwen3_next", 4, 4), ("qwen3_5_text", 1, 1), ("qwen3_5_moe_text", 3, 3)]


@pytest.mark.parametrize("model_type, k, c", ARCH_CASES, ids=[f"{m}-k{k}-C{c}" for m, k, c in ARCH_CASES])
def test_spec_three_architectures_equal_plain(tmp_path, model_type, k, c):
    """Each architecture with a random MTP set, chunked prefill, C + 1 requests: greedy and
    seeded tokens equal decoding without drafts (random drafts are mostly rejected: the
    rejection path, the commit at the first position, every Verify unit)."""
    folder = _random_mtp_folder(tmp_path, model_type)
    model = load_model(folder, "float32")
    vocab = model.config.vocab_size
    work = [(p, GREEDY if i % 2 == 0 else SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True))
            for i, p in enumerate(_prompts(c + 1, seed=51, vocab=vocab, lo=20, hi=80))]
    outs = []
    for kk in (0, k):
        cfg = EngineConfig(model=folder, dtype="float32", max_concurrency=c if kk else 2, max_context=160,
                           chunk_size=16, progress=False, speculative_tokens=kk,
                           context_cache=ContextCacheConfig(host_capacity_bytes=1 << 20))
        engine = Engine(cfg, program=Program(cfg, model=model), start=False)
        outs.append([r.token_ids for r in _run(engine, work)])
        if kk:
            assert engine.stats()["spec_verify_units"] > 0
    assert outs[0] == outs[1]


def test_spec_stats_reach_metrics_and_grpc_counters():
    """The speculative counters of a stats snapshot become Prometheus families (drafted,
    accepted, rejected, by position, mean accepted length)."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from server.metrics import EngineCollector

    class Fake:
        def stats(self):
            return {"spec_drafted_tokens": 30, "spec_accepted_tokens": 12, "spec_rejected_tokens": 18,
                    "spec_verify_units": 10, "spec_accepted_by_position": [7, 4, 1], "spec_mean_accepted_length": 2.2}

    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(Fake))
    text = generate_latest(registry).decode()
    for line in ('ninfer:spec_draft_tokens_total 30.0', 'ninfer:spec_accepted_tokens_total 12.0',
                 'ninfer:spec_rejected_tokens_total 18.0', 'ninfer:spec_verify_units_total 10.0',
                 'ninfer:spec_accepted_tokens_by_position_total{position="2"} 4.0',
                 'ninfer:spec_mean_accepted_length 2.2'):
        assert line in text, line


def test_spec_mtp_pool_in_the_plan_and_the_ledger(tiny_model):
    """RES-1: the MTP layers' K/V are a backend KV pool sized from their geometry — the plan's
    backend pool is 64-token pages of (MTP layers × K,V × kv heads × head dim × itemsize), as
    many tokens as Main KV, its bytes charged to the budget — and the Program builds it as a
    ledger pool of its own (`backend_kv:mtp`, those unit bytes, what the Host arena and every page
    copy move), the Main KV unit unchanged."""
    from ninfer_jax.model.mtp_steps import mtp_pool_geometry
    from ninfer_jax.model.spec_steps import MTP_POOL
    from ninfer_jax.plan import compiled_step_programs, plan_capacity
    import ledger

    cfg = tiny_model.config
    base = EngineConfig(max_concurrency=2, max_context=256, progress=False)
    spec = EngineConfig(max_concurrency=2, max_context=256, progress=False, speculative_tokens=3)
    plain_plan, spec_plan = plan_capacity(base, cfg, 4), plan_capacity(spec, cfg, 4)
    g = mtp_pool_geometry(cfg, jnp.float32)
    assert plain_plan.backend_pools == () and spec_plan.backend_pools == ((64, g.page_bytes),)
    assert spec_plan.backend_pool_bytes == spec_plan.kv_pages * g.page_bytes
    assert spec_plan.capacity.mtp_pages == spec_plan.kv_pages and plain_plan.capacity.mtp_pages == 0
    # prefill at page-table widths 2 and 4 (plan/workspace.prefill_table_widths); C=2: decode bucket 2
    assert compiled_step_programs(spec) == 2 + 2 * 1 and compiled_step_programs(base) == 2 + 1
    program = Program(spec, model=tiny_model)
    plain_program = Program(base, model=tiny_model)
    pools = program.state.pools
    assert MTP_POOL not in plain_program.state.pools
    assert pools[MTP_POOL].spec.capacity == spec_plan.kv_pages and pools[MTP_POOL].spec.unit_bytes == g.page_bytes
    assert pools[MTP_POOL].spec.page_tokens == 64
    assert program.stores.pools[ledger.MAIN_KV].unit_bytes == plain_program.stores.pools[ledger.MAIN_KV].unit_bytes
    assert program.execution_tag != plain_program.execution_tag  # CKP-4: MTP points are their own execution
