"""The DFlash drafter's training (issue 35, ninfer_jax/train/dflash_train.py): a training example is
the engine's draft, a few steps lower the loss, `acceptance` counts what greedy verification
would accept, and the export loads back through the drafter loader. The full run is
scripts/train_builtin_dflash.py, not a test."""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from ninfer_jax import Engine, EngineConfig
from ninfer_jax.model import builtin, dflash, load_model
from ninfer_jax.program.program import Program
from ninfer_jax.train import dflash_train as D

SHAPE = D.DrafterShape(block_size=4, target_layer_ids=(0, 3))


@pytest.fixture(scope="module")
def data():
    model = load_model(builtin.NAME)
    cfg = EngineConfig(max_concurrency=2, max_context=256, progress=False)
    engine = Engine(cfg, program=Program(cfg, model=model))
    rng = np.random.default_rng(0)
    try:
        seqs = D.rollouts(engine, [rng.integers(0, 1000, 12).tolist() for _ in range(6)], 20)
    finally:
        engine.close()
    dcfg = dflash.parse_dflash_config(SHAPE.config_json(model.config))
    return model, dcfg, seqs, D.target_features(model, SHAPE, seqs)


def test_rollouts_are_the_targets_greedy_continuations(data):
    model, _, seqs, _ = data
    assert seqs.shape == (6, 32)
    for s in seqs[:2]:  # the whole-sequence forward's argmax at each generated position
        logits = np.asarray(model.forward(s[:-1]))
        assert (logits[11:].argmax(-1) == s[12:]).all()


def test_acceptance_counts_the_leading_drafts_of_the_reference_forward(data):
    """A frontier's count equals the leading matches of `dflash.forward`'s greedy block over the
    context 0..n-1 (what the engine drafts, tests/engine/test_engine_dflash.py), with the shipped
    drafter, so that the counts are not all zero."""
    model, _, seqs, _ = data
    shipped = dflash.load_drafter(builtin.drafter_folder(), np.float32)
    dcfg, params = shipped.config, shipped.params
    feats = D.target_features(model, D.DrafterShape(target_layer_ids=dcfg.target_layer_ids), seqs)
    got = D.acceptance(model, dcfg, params, seqs, feats, first=10)
    bs = dcfg.block_size
    assert got.shape == (6, 32 - bs + 1 - 10) and got.max() >= 1
    lm = model.functional[0](model.functional[1])
    for r, n in ((0, 10), (4, 17), (5, 32 - bs)):  # a few frontiers: each n is a new eager shape
        block = jnp.asarray([seqs[r, n]] + [dcfg.mask_token_id] * (bs - 1))
        hidden = dflash.forward(params, dcfg, jnp.asarray(feats[r, :n]), jnp.arange(n), lm.embed_tokens(block),
                                n + jnp.arange(bs))
        drafts = np.asarray(jnp.argmax(dflash.scale_logits(dcfg, lm.logits(hidden[1:])), -1))
        hits = drafts == seqs[r, n + 1:n + bs]
        assert got[r, n - 10] == (bs - 1 if hits.all() else np.argmin(hits))
    assert D.accepted_length(got, 1) <= D.accepted_length(got, 3) <= bs - 1


def test_a_few_steps_lower_the_loss_and_the_export_loads_back(data, tmp_path):
    model, dcfg, seqs, feats = data
    tc = D.TrainConfig(steps=30, batch=4, anchors=8, peak_lr=1e-2, warmup_steps=3, log_every=10)
    params, losses = D.train(model, dcfg, seqs, feats, tc)
    assert len(losses) == 3
    before = D.loss(model, dcfg, D.init_drafter(dcfg, tc.seed), seqs, feats)
    after = D.loss(model, dcfg, params, seqs, feats)
    assert after < before - 0.5, (before, after)
    save_file(dflash.hf_tensors(dcfg, params), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(SHAPE.config_json(model.config)))
    back = dflash.load_drafter(str(tmp_path), np.float32)
    assert back.config == dcfg
    for a, b in zip(*(np.asarray(x) for x in (params["fc"], back.params["fc"]))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(params["layers"][0]["down_proj"], back.params["layers"][0]["down_proj"])
