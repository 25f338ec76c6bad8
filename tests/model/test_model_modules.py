"""The nnx modules: the same logits as the reference pass, export round trips, MTP, gradients."""
import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from ninfer_jax.model import builtin
from ninfer_jax.model.config import parse_config
from ninfer_jax.model.model import load_model
from ninfer_jax.model.modules import HybridLM, init_params, mtp_shapes
from ninfer_jax.model.weights import hf_tensors, mtp_params
from oracle_paths import oracle_dir


def _tokens(cfg, n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, n), jnp.int32)


def _shapes(tree):
    return jax.tree.map(lambda x: tuple(x.shape), tree)


@pytest.mark.parametrize("name", ["builtin", "qwen3_next"])
def test_hybrid_lm_logits_equal_model_forward(name):
    """qwen3_next: MoE with a shared expert and the grouped in_proj_qkvz / in_proj_ba layout."""
    model = load_model(builtin.NAME if name == "builtin" else oracle_dir("qwen3_next"))
    tokens = _tokens(model.config, 37)
    logits, hidden = jax.jit(lambda t: HybridLM(model.config, model.params)(t))(tokens)
    assert logits.dtype == jnp.float32 and hidden.shape == (37, model.config.hidden_size)
    chex.assert_trees_all_close(logits, model.forward(tokens), atol=1e-5, rtol=0)


def _mtp_config(raw: dict, **extra):
    return dict(raw, mtp_num_hidden_layers=1, **extra)


def _write(folder, raw_config, tensors):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw_config))
    save_file(tensors, str(folder / "model.safetensors"))
    return str(folder)


@pytest.mark.parametrize("name", ["builtin", "qwen3_next"])
def test_hf_tensors_round_trip_through_load_model(tmp_path, name):
    if name == "builtin":
        raw = _mtp_config(builtin.HF_CONFIG)
    else:
        with open(f"{oracle_dir('qwen3_next')}/config.json") as f:
            raw = _mtp_config(json.load(f))
    cfg = parse_config(raw)
    params, mtp = init_params(cfg, seed=7)
    expected = jax.tree.map(tuple, mtp_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    chex.assert_trees_all_equal(_shapes(mtp), expected)
    folder = _write(tmp_path / name, raw, hf_tensors(params, mtp, cfg))
    model = load_model(folder, dtype="float32")
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, model.params), params)
    assert model.mtp is not None
    chex.assert_trees_all_equal(mtp_params(model.mtp, cfg), mtp)
    # And back out of the module: to_params gives the same pytrees.
    back_params, back_mtp = HybridLM(cfg, params, mtp).to_params()
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, (back_params, back_mtp)), (params, mtp))


def test_mtp_logits_shape_and_finite():
    cfg = dataclasses.replace(builtin.config(), mtp_num_hidden_layers=1)
    params, mtp = init_params(cfg, seed=3)
    lm = HybridLM(cfg, params, mtp)
    tokens = _tokens(cfg, 20, seed=1)
    logits, hidden = jax.jit(lm)(tokens)  # compiled whole: eager ops compile one by one
    out = jax.jit(lm.mtp_logits)(hidden[:-1], tokens[1:])
    chex.assert_shape(out, (19, cfg.vocab_size))
    chex.assert_type(out, jnp.float32)
    chex.assert_tree_all_finite(out)
    # mtp_logits normalises the hidden with the main final norm first (the vLLM convention).
    from_final = jax.jit(lambda h, t: lm.mtp_logits_from_final(lm.final_norm(h), t))
    chex.assert_trees_all_close(out, from_final(hidden[:-1], tokens[1:]))


def test_main_weights_do_not_depend_on_mtp_layers():
    cfg = dataclasses.replace(builtin.config(), mtp_num_hidden_layers=0)
    with_mtp = dataclasses.replace(cfg, mtp_num_hidden_layers=2)
    plain, none = init_params(cfg, seed=5)
    same, mtp = init_params(with_mtp, seed=5)
    assert none is None and len(mtp["layers"]) == 2
    chex.assert_trees_all_equal(plain, same)


def test_grad_through_split_merge():
    cfg = dataclasses.replace(builtin.config(), mtp_num_hidden_layers=1)
    params, mtp = init_params(cfg, seed=11)
    graphdef, state = nnx.split(HybridLM(cfg, params, mtp))
    tokens = _tokens(cfg, 16, seed=2)

    @jax.jit
    def loss(state):
        lm = nnx.merge(graphdef, state)
        logits, hidden = lm(tokens)
        main = -jnp.mean(jax.nn.log_softmax(logits[:-1])[jnp.arange(15), tokens[1:]])
        extra = -jnp.mean(jax.nn.log_softmax(lm.mtp_logits(hidden[:-2], tokens[1:-1]))[jnp.arange(14), tokens[2:]])
        return main + extra

    value, grads = jax.value_and_grad(loss)(state)
    assert np.isfinite(float(value))
    chex.assert_trees_all_equal_shapes(grads, state)
    chex.assert_tree_all_finite(grads)
    # Every parameter, the MTP head's included, gets a gradient.
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
