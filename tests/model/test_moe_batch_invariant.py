"""The MoE feed-forward is batch-invariant and reads only the experts it uses (issue 33).

Batch invariance (doctrine 1): a row's logits, and everything its decode step writes, are
bit-identical whether it runs alone (the 2-row bucket beside a padding row) or beside any other
rows, at any bucket and any place in the batch. On the Qwen3-Next oracle model (three MoE
layers, four experts, top-2) five prompts are prefilled into their own slots, then decoded for
a few steps in several arrangements; the logits of every step and the pools afterwards must be
equal as floats (`np.array_equal`), in float32 and in bfloat16.

No whole expert tensor moves: the optimized HLO of the decode step holds no copy, transpose,
convert or densified operand of a whole `[E, H, I]` expert tensor and no product over one
(`hlo_audit.expert_relayouts`), which `ragged_dot`'s CPU lowering made in every step.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model.hlo_audit import expert_relayouts
from ninfer_jax.model.config import parse_config
from ninfer_jax.model.model import Model, load_model
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.pools import init_pools
from ninfer_jax.model.weights import param_shapes
from oracle_paths import oracle_dir

PROMPT_LENS = (5, 11, 17, 23, 30)
CHUNK = 32  # one prefill row of up to CHUNK tokens per prompt
STEPS = 3  # decode steps per arrangement
PAGES = 2  # page-table width; row r owns pages 1 + 2r, 2 + 2r (page 0 is the padding rows')
SLOTS = len(PROMPT_LENS) + 1

# Each arrangement is the list of batches run at every step (None: a padding row, slot -1).
ALONE = [[r, None] for r in range(len(PROMPT_LENS))]
ARRANGEMENTS = {
    "alone, second place": [[None, r] for r in range(len(PROMPT_LENS))],
    "bucket 4": [[3, 0, 4, 1], [None, None, 2, None]],
    "bucket 4, other order": [[1, 2, None, 4], [None, 0, 3, None]],
    "bucket 8": [[4, 2, 0, 3, 1, None, None, None]],
    "bucket 8, padding between": [[None, 1, None, 3, 0, 4, None, 2]],
    "buckets 2 and 8 mixed": [[2, 4], [None, None, None, None, None, 1, 3, 0]],
}


# A wider random MoE on the same layout: top-6 of 16 experts, so a token's expert outputs are
# summed in an order that matters (two addends commute exactly; the oracle model has top-2).
WIDE = dict(hidden_size=128, num_experts=16, num_experts_per_tok=6, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, mlp_only_layers=[])


def _wide_model():
    with open(os.path.join(oracle_dir("qwen3_next"), "config.json")) as f:
        cfg = parse_config(dict(json.load(f), **WIDE))
    rng = np.random.default_rng(3)

    def leaf(name, shape, in_gdn):
        if name.endswith("norm"):  # zero-centred norms at 0 (scale 1); the GDN output norm at 1
            return jnp.full(shape, 1.0 if (name == "norm" and in_gdn) else 0.0, jnp.float32)
        return jnp.asarray(rng.standard_normal(shape, np.float32) * 0.05)

    shapes = param_shapes(cfg)
    params = {k: leaf(k, v, False) for k, v in shapes.items() if k != "layers"}
    params["layers"] = [{k: leaf(k, v, "conv" in layer) for k, v in layer.items()} for layer in shapes["layers"]]
    return Model(config=cfg, params=params, dtype=jnp.dtype(jnp.float32), name="random:wide-moe")


@pytest.fixture(scope="module", params=["qwen3_next float32", "qwen3_next bfloat16", "wide float32"])
def moe_run(request):
    """(steps, prefilled pools on the host, rng tokens) for one MoE model and dtype. Its own
    CompiledSteps: buckets are keyed by the per-call shapes, not the pools'."""
    name, dtype = request.param.split()
    model = load_model(oracle_dir(name), dtype=dtype) if name != "wide" else _wide_model()
    cfg = model.config
    steps = CompiledSteps(model, progress=False)
    kv, state = init_pools(cfg, 1 + PAGES * len(PROMPT_LENS), SLOTS, model.dtype)
    rng = np.random.default_rng(7)
    for r, n in enumerate(PROMPT_LENS):
        tokens = np.zeros((1, CHUNK), np.int32)
        tokens[0, :n] = rng.integers(1, cfg.vocab_size, n)
        _, _, kv, state = steps.prefill(kv, state, jnp.asarray(tokens), jnp.zeros(1, jnp.int32),
                                        jnp.asarray([n], jnp.int32), jnp.asarray(_pages(r)[None]),
                                        jnp.asarray([r], jnp.int32))
    decode_tokens = rng.integers(1, cfg.vocab_size, (len(PROMPT_LENS), STEPS)).astype(np.int32)
    return steps, jax.tree.map(np.asarray, (kv, state)), decode_tokens


def _pages(r):
    return np.arange(1 + PAGES * r, 1 + PAGES * (r + 1), dtype=np.int32)


def _decode(steps, host_pools, decode_tokens, batches):
    """Runs STEPS decode steps of `batches` from the prefilled pools: ({(row, step): logits},
    the pools afterwards, on the host)."""
    kv, state = jax.tree.map(jnp.asarray, host_pools)  # fresh buffers: the steps donate them
    logits = {}
    for s in range(STEPS):
        for batch in batches:
            real = [r for r in batch if r is not None]
            tokens = [decode_tokens[r, s] if r is not None else 0 for r in batch]
            positions = [PROMPT_LENS[r] + s if r is not None else 0 for r in batch]
            table = [_pages(r) if r is not None else np.zeros(PAGES, np.int32) for r in batch]
            slots = [r if r is not None else -1 for r in batch]
            out, _, kv, state = steps.decode(kv, state, jnp.asarray(tokens, jnp.int32),
                                             jnp.asarray(positions, jnp.int32), jnp.asarray(np.stack(table)),
                                             jnp.asarray(slots, jnp.int32))
            out = np.asarray(out)
            for place, r in enumerate(batch):
                if r is not None:
                    logits[(r, s)] = out[place]
            assert len(real) == len(set(real))
    return logits, jax.tree.map(np.asarray, (kv, state))


def test_moe_decode_is_batch_invariant(moe_run):
    steps, host_pools, decode_tokens = moe_run
    alone, alone_pools = _decode(steps, host_pools, decode_tokens, ALONE)
    assert len(alone) == len(PROMPT_LENS) * STEPS
    # The rows do differ (different prompts and tokens): equality below is not vacuous.
    assert not np.array_equal(alone[(0, 0)], alone[(1, 0)])
    for name, batches in ARRANGEMENTS.items():
        logits, pools = _decode(steps, host_pools, decode_tokens, batches)
        assert logits.keys() == alone.keys(), name
        differ = sorted(k for k in alone if not np.array_equal(logits[k], alone[k]))
        assert not differ, f"{name}: logits of (row, step) {differ} differ from the row alone"
        leaves, ref = jax.tree.leaves(pools), jax.tree.leaves(alone_pools)
        differ = [i for i, (a, b) in enumerate(zip(leaves, ref)) if not np.array_equal(a, b)]
        assert not differ, f"{name}: pool leaves {differ} differ from the rows decoded alone"


def test_moe_decode_step_moves_no_whole_expert_tensor(moe_run):
    steps, host_pools, decode_tokens = moe_run
    for batches in (ALONE[:1], ARRANGEMENTS["bucket 8"]):  # compiles buckets 2 and 8 if not yet
        _decode(steps, host_pools, decode_tokens, batches)
    cfg = steps.model.config
    shapes = [(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size),
              (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size)]
    decode = {bucket: exe for bucket, exe in steps._executables.items() if bucket[0] == "decode"}
    assert {bucket[1] for bucket in decode} >= {(2,), (8,)}, decode.keys()
    for bucket, exe in decode.items():
        found = expert_relayouts(exe.as_text(), shapes)
        assert not found, f"decode bucket {bucket[1]} moves whole expert tensors: {found}"


def test_the_expert_audit_sees_ragged_dot_relayouts():
    """The detector itself: `ragged_dot` (the grouped matmul the MoE used before) densifies or
    relayouts the whole expert tensor on XLA's CPU backend; a one-expert slice does not count."""
    e, h, i = 4, 32, 16
    w = jnp.zeros((e, h, i), jnp.float32)
    x = jnp.ones((6, h), jnp.float32)
    sizes = jnp.array([2, 0, 3, 1], jnp.int32)
    grouped = jax.jit(lambda w, x, s: jax.lax.ragged_dot(x, w, s)).lower(w, x, sizes).compile().as_text()
    assert expert_relayouts(grouped, [(e, h, i)])
    sliced = jax.jit(lambda w, x, k: x @ w[k]).lower(w, x, jnp.int32(2)).compile().as_text()
    assert not expert_relayouts(sliced, [(e, h, i)])


def test_moe_model_is_differentiable_through_the_experts(oracle_models):
    """Fine-tuning a MoE model through `HybridLM`: reverse mode cannot run through the tile loop
    (its length is data), so `routed_experts` carries the gradient of the same function as
    grouped products. Every expert tensor gets a gradient, and it is the loss's derivative: a
    central difference along the gradient of the last MoE layer's experts agrees (the last:
    a perturbation upstream of another router can flip a near-tied routing decision, which a
    difference quotient sees as a jump)."""
    from ninfer_jax.model.modules import HybridLM

    model, _ = oracle_models["qwen3_next"]
    cfg = model.config
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, cfg.vocab_size, 24), jnp.int32)

    def loss(params):
        logits, _ = HybridLM(cfg, params)(tokens[:-1])
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(23), tokens[1:]])

    params = jax.tree.map(jnp.asarray, model.params)
    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(float(value))
    moe_layers = [i for i, kind in enumerate(cfg.mlp_types) if kind == "moe"]
    assert moe_layers
    for i in moe_layers:
        for key in ("experts_gate", "experts_up", "experts_down", "router"):
            g = np.asarray(grads["layers"][i][key])
            assert np.isfinite(g).all() and np.abs(g).max() > 0, (i, key)
    layer = moe_layers[-1]
    direction = {k: grads["layers"][layer][k] for k in ("experts_gate", "experts_up", "experts_down")}

    def moved(eps):
        layers = list(params["layers"])
        layers[layer] = dict(layers[layer], **{k: layers[layer][k] + eps * d for k, d in direction.items()})
        return dict(params, layers=layers)

    eps = 3e-2  # the weights' scale is 0.1: a small step, far above float32's resolution of the loss
    jloss = jax.jit(loss)
    numeric = (float(jloss(moved(eps))) - float(jloss(moved(-eps)))) / (2 * eps)
    analytic = sum(float(jnp.vdot(d, d)) for d in direction.values())
    assert abs(numeric - analytic) <= 1e-3 * analytic, (numeric, analytic)


def test_padding_rows_run_no_expert():
    """`layers.moe(..., rows)`: a token marked not real (a step's padding row, a chunk's token
    past its length) is routed to no expert, so its routed output is 0 and only the shared expert
    remains; every real token's output is bit-identical to the unmasked MoE's."""
    from ninfer_jax.model import layers

    model = _wide_model()
    cfg = model.config
    p = next(layer for layer in model.params["layers"] if "experts_gate" in layer)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 8, cfg.hidden_size), np.float32))
    rows = jnp.asarray(np.arange(8)[None, :] < np.asarray([[3], [8]]))  # row 0: 3 real tokens
    full = np.asarray(layers.moe(p, x, cfg))
    masked = np.asarray(layers.moe(p, x, cfg, rows))
    real = np.asarray(rows)
    assert np.array_equal(masked[real], full[real])
    flat = x.reshape(-1, cfg.hidden_size)
    shared = layers.dense_mlp({"gate_proj": p["shared_gate_proj"], "up_proj": p["shared_up_proj"],
                               "down_proj": p["shared_down_proj"]}, flat)
    shared = jax.nn.sigmoid(layers.matmul(flat, p["shared_expert_gate"]).astype(jnp.float32)) * shared
    only_shared = np.asarray(shared).reshape(masked.shape)
    assert np.array_equal(masked[~real], only_shared[~real])
    assert not np.array_equal(masked[~real], full[~real])  # the unmasked tokens did run experts
