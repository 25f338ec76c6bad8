"""DFlash speculative decoding in the engine (issue 35): `speculative_method="dflash"` with a
drafter folder as published. Every decode row is a Verify unit whose drafts come from the
drafter's block over the row's paged context (dflash_steps.py), and the tokens are exactly those
of decoding without drafts: greedy and seeded sampling, chunked prefill, C = 1 and 3, through
cache hits and Snapshot / Replay pauses (doctrine 1, RES-1 Verify, CKP-1). Bad settings are typed
errors before any weight loads."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, EngineConfig, SamplingParams
from ninfer_jax.engine.engine import Engine
from ninfer_jax.errors import ConfigError
from ninfer_jax.model import dflash

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def write_drafter(folder, *, hidden=64, vocab=1024, layers=(0, 2), block=4, seed=0, **changes) -> str:
    """A random drafter for the built-in model (hidden 64, 4 layers, vocabulary 1,024) in the
    published layout."""
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 96, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab,
           "max_position_embeddings": 4096, "tie_word_embeddings": False,
           "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": list(layers), "block_size": block}}
    raw.update(changes)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in dflash.hf_shapes(dflash.parse_dflash_config(raw)).items():
        tensors[name] = ((1 + 0.1 * rng.standard_normal(shape)) if len(shape) == 1 else
                         rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(raw, f)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    return str(folder)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("dflash"))


def _prompts(n, seed, lo=20, hi=150):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _run(engine, work):
    handles = [engine.submit(p, sp) for p, sp in work]
    run_until_done(engine, handles)
    out = [h.result() for h in handles]
    assert all(r.finish_reason in ("length", "stop") for r in out), [r.error for r in out]
    return [r.token_ids for r in out]


@pytest.mark.parametrize("k, c", [(3, 2)])
def test_dflash_equals_plain_decode(tiny_model, drafter, k, c):
    rng = np.random.default_rng(k)
    work = [(p, GREEDY) for p in _prompts(c + 2, seed=k)]
    work += [(p, SamplingParams(temperature=0.9, seed=int(rng.integers(1 << 30)), max_tokens=20, ignore_eos=True))
             for p in _prompts(2, seed=k + 50)]
    plain = make_engine(tiny_model, max_concurrency=c, max_context=256, chunk_size=16)
    engine = make_engine(tiny_model, max_concurrency=c, max_context=256, chunk_size=16, speculative_tokens=k,
                         speculative_method="dflash", draft_model=drafter)
    assert engine.program.spec_pool == "backend_kv:dflash"
    assert _run(engine, work) == _run(plain, work)
    stats = engine.stats()
    assert stats["spec_drafted_tokens"] > 0 and len(stats["spec_accepted_by_position"]) == k
    # A second round reuses the first's cached prefixes (with their drafter context pages).
    again = [(p + [7, 8, 9], GREEDY) for p, _ in work[:2]]
    assert _run(engine, again) == _run(plain, again)
    assert engine.stats()["cached_tokens"] > 0
    assert_idle_and_empty(engine)


def test_the_shipped_drafter_is_accepted_and_exact(tiny_model):
    """`builtin:tiny-hybrid-dflash` (scripts/train_builtin_dflash.py) on held-out text: the same
    tokens as plain decoding, and most drafts accepted (a random drafter's Verify units emit
    about one token: its own)."""
    from ninfer_jax.bench.spec_bench import prompts
    from ninfer_jax.model import builtin

    work = [(p, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)) for p in prompts(4)]
    plain = make_engine(tiny_model, max_concurrency=2, max_context=256, chunk_size=64)
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, chunk_size=64, speculative_tokens=3,
                         speculative_method="dflash", draft_model=builtin.DRAFTER_NAME)
    assert _run(engine, work) == _run(plain, work)
    stats = engine.stats()
    assert stats["spec_mean_accepted_length"] >= 2.0, stats["spec_mean_accepted_length"]
    assert_idle_and_empty(engine)


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_dflash_pauses_keep_outputs(tiny_model, drafter, route):
    """Main KV at its CFG-6 minimum: two long requests cannot co-reside, the younger is paused
    between Verify units and resumed; outputs equal a plain engine's."""
    work = [(p, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)) for p in _prompts(2, 9, 90, 100)]
    cache = ContextCacheConfig(host_capacity_bytes=1 << 20, device_state_slots=0)
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, kv_capacity=256, chunk_size=64,
                         pause_route=route, speculative_tokens=3, speculative_method="dflash", draft_model=drafter,
                         context_cache=cache)
    plain = make_engine(tiny_model, max_concurrency=1, max_context=256, chunk_size=64)
    assert _run(engine, work) == _run(plain, work)
    assert engine.stats()[f"pauses_{route}"] >= 1
    assert_idle_and_empty(engine)


def test_dflash_cancels_in_prefill_and_decode_under_pressure(tiny_model, drafter):
    """Main KV at its minimum, no spare slot, a tiny Host: one request cancelled in its chunked
    prefill, one after some Verify units; the ledger stays consistent every cycle, the survivor
    equals a plain engine's, and everything is released."""
    from ninfer_jax.engine.request import DECODE

    cache = ContextCacheConfig(host_capacity_bytes=4096, device_state_slots=0)
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, kv_capacity=256, chunk_size=32,
                         speculative_tokens=3, speculative_method="dflash", draft_model=drafter, context_cache=cache)
    keep, in_prefill, in_decode = _prompts(3, 17, 90, 110)
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    survivor = engine.submit(keep, sp)
    a, b = engine.submit(in_prefill, sp), engine.submit(in_decode, sp)
    engine.step()
    engine.check_integrity()
    a.cancel()  # its prompt needs several 32-token chunks: still in prefill
    for _ in range(200):
        if any(r.phase == DECODE and r.output for r in engine.core.residents if r.handle is b):
            break
        engine.step()
        engine.check_integrity()
    b.cancel()
    run_until_done(engine, [survivor, a, b])
    assert a.result().finish_reason == "cancelled" and b.result().finish_reason in ("cancelled", "length")
    plain = make_engine(tiny_model, max_concurrency=1, max_context=256, chunk_size=32)
    assert survivor.result().token_ids == _run(plain, [(keep, sp)])[0]
    assert_idle_and_empty(engine)


def test_bad_settings_are_typed_before_loading(tmp_path, drafter):
    with pytest.raises(ConfigError, match="speculative_method: must be one of"):
        EngineConfig(speculative_tokens=2, speculative_method="eagle")
    with pytest.raises(ConfigError, match="dflash2 is not built"):
        EngineConfig(speculative_tokens=2, speculative_method="dflash2")
    with pytest.raises(ConfigError, match="draft_model: speculative_method=dflash needs"):
        EngineConfig(model=str(tmp_path), speculative_tokens=2, speculative_method="dflash")
    # the built-in model drafts with its shipped drafter by default (the demo)
    assert EngineConfig(speculative_tokens=2, speculative_method="dflash").draft_model == "builtin:tiny-hybrid-dflash"
    with pytest.raises(ConfigError, match="draft_model: a drafter folder goes with"):
        EngineConfig(speculative_tokens=2, draft_model=drafter)
    with pytest.raises(ConfigError, match=r"speculative_tokens: must be an int in \[0, 15\]"):
        EngineConfig(speculative_tokens=16, speculative_method="dflash", draft_model=drafter)

    def engine(folder, k=2):
        return Engine(EngineConfig(speculative_tokens=k, speculative_method="dflash", draft_model=folder,
                                   progress=False))

    with pytest.raises(ConfigError, match="speculative_tokens: 4 drafts: the drafter's block of 4"):
        engine(drafter, k=4)
    with pytest.raises(ConfigError, match="hidden_size: drafter 32 != target 64"):
        engine(write_drafter(tmp_path / "narrow", hidden=32))
    with pytest.raises(ConfigError, match="target_layer_ids"):
        engine(write_drafter(tmp_path / "deep", layers=(1, 9)))
    with pytest.raises(ConfigError, match="vocab_size"):
        engine(write_drafter(tmp_path / "vocab", vocab=512))


class _Reference:
    """The drafter over a whole committed sequence, compiled once: the target's layer outputs of
    the whole-sequence forward (causal, so positions < n are those of seq[:n]), the context K/V of
    every position (`dflash.context_kv`), and a block drafted against the first n of them."""

    WIDTH = 256  # max_context: every sequence padded to it, one compilation

    def __init__(self, model, dparams, dcfg):
        import jax
        import jax.numpy as jnp

        self.dcfg = dcfg
        merger, leaves = model.functional

        def features(tokens):
            lm = merger(leaves)
            x = lm.embed_tokens(tokens)
            outs = []
            for layer in lm.layers:
                x = layer(x, jnp.arange(tokens.shape[0]))
                outs.append(x)
            outs[-1] = lm.final_norm(x)
            feats = jnp.concatenate([outs[i] for i in dcfg.target_layer_ids], axis=-1)
            return dflash.context_kv(dparams, dcfg, feats, jnp.arange(tokens.shape[0]))

        def drafts(k, v, n, first):
            lm = merger(leaves)
            block = jnp.concatenate([first[None], jnp.full(dcfg.block_size - 1, dcfg.mask_token_id, jnp.int32)])
            hidden = dflash.draft_block(dparams, dcfg, k, v, n, lm.embed_tokens(block), n + jnp.arange(dcfg.block_size))
            return jnp.argmax(dflash.scale_logits(dcfg, lm.logits(hidden[1:])), axis=-1)

        self._features, self._drafts = jax.jit(features), jax.jit(drafts)

    def context(self, seq):
        padded = np.zeros(self.WIDTH, np.int32)
        padded[:len(seq)] = seq
        return self._features(padded)

    def drafts(self, ctx, seq, n):
        return np.asarray(self._drafts(ctx[0], ctx[1], np.int32(n), np.int32(seq[n])))


@pytest.mark.parametrize("route", ["replay", "snapshot"])
def test_drafts_follow_the_committed_sequence(tiny_model, drafter, route):
    """CKP-1 / CKP-3 for the drafter: through chunked prefill, Verify commits, a cache hit on an
    earlier request's end (its context pages bound with the point) and pauses, every block the
    engine drafts is the drafter's block over the whole committed sequence."""
    import jax

    cache = ContextCacheConfig(host_capacity_bytes=1 << 20, device_state_slots=1)
    engine = make_engine(tiny_model, max_concurrency=2, max_context=256, kv_capacity=256, chunk_size=32,
                         pause_route=route, speculative_tokens=3, speculative_method="dflash", draft_model=drafter,
                         context_cache=cache)
    calls = []
    real = engine.program.spec_decode

    def spy(rows, wanted):
        logits, drafts = real(rows, wanted)
        calls.extend((r.token, r.position, d.copy()) for r, d in zip(rows, drafts))
        return logits, drafts

    engine.program.spec_decode = spy
    first = _prompts(2, 21, 90, 100)  # 3 pages each with their outputs: they cannot co-reside in 4
    work = [(p, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)) for p in first]
    done = _run(engine, work)
    later = [(first[0] + list(done[0]) + [3, 4, 5], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))]
    done += _run(engine, later)
    assert engine.stats()["cached_tokens"] > 0 and engine.stats()[f"pauses_{route}"] >= 1
    seqs = [list(p) + list(out) for (p, _), out in zip(work + later, done)]
    dparams = jax.tree.map(np.asarray, engine.program.steps._spec_leaves[1])
    dcfg = engine.program.steps.drafter_config
    ref = _Reference(tiny_model, dparams, dcfg)
    contexts = [ref.context(s) for s in seqs]
    checked = 0
    for token, n, drafts in calls:
        # A row names its token and position only; with repetitive outputs another request may
        # hold the same pair, so the row's drafts must be those of one of the sequences that do.
        owners = [i for i, s in enumerate(seqs) if n < len(s) and s[n] == token]
        assert owners, (token, n)
        wants = [ref.drafts(contexts[i], seqs[i], n)[:len(drafts)] for i in owners]
        assert any(np.array_equal(drafts, w) for w in wants), (n, drafts, wants)
        checked += 1
    assert checked > 20
