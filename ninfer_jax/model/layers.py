"""The layers of the hybrid family, as pure functions over one layer's parameters.

Math facts, checked against transformers' qwen3_next / qwen3_5 code:
- zero-centred RMSNorm `x·rsqrt(mean x²+eps)·(1+w)` everywhere but the GDN output norm, which
  is plain `w` and then `·silu(z)`;
- `q_proj` output grouped per head as `[q | gate]`, attention output `·sigmoid(gate)`;
- QK-norm before partial RoPE (NeoX rotate-half on the first `rotary_dim` dims);
- GDN: conv(K)+SiLU over `[q|k|v]`, l2-norm of q, k (eps inside the sum), q·Dk^-0.5,
  `g = -exp(A_log)·softplus(a+dt_bias)`, `beta = sigmoid(b)`, recurrent state in float32.

Functions here take leading axes `...` so the whole-sequence reference (`[T, H]`) and the
paged steps (`[R, T, H]`, `[B, H]`) share them; only the token mixers' cores differ.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ninfer_jax.model.config import ModelConfig
from pallas_kernels._common import softmax, tree_sum


# Batch invariance (doctrine 1): a decode-sized matmul runs its rows in blocks of ROW_BLOCK,
# every block the same `[ROW_BLOCK, K] @ [K, N]` product, so a row's result does not depend on
# how many rows share the step or where it sits among them. XLA's CPU dot takes a different
# path for one row (a matrix-vector product) than for several, with another summation order;
# and the order of a larger product may depend on its row count. At NATIVE_ROWS rows and more
# (a prefill chunk, always chunk_size rows of one request; the whole-sequence reference) the
# product is one native matmul: its shape never depends on other requests.
ROW_BLOCK = 8
NATIVE_ROWS = 64


def matmul(x: jax.Array, w: jax.Array, *, w_nk: bool = False) -> jax.Array:
    """x `[..., K]` @ w `[K, N]` (or @ w.T for w `[N, K]` with `w_nk`: the tied lm head reads the
    embedding as it is stored, `_product`): full precision for float32 (exactness), the narrow
    dtype's native product otherwise; batch-invariant below NATIVE_ROWS rows (ROW_BLOCK)."""
    lead, k = x.shape[:-1], x.shape[-1]
    m = math.prod(lead)
    if m >= NATIVE_ROWS:
        return _product(x, w, w_nk)
    blocks = -(-m // ROW_BLOCK)
    rows = jnp.pad(x.reshape(m, k), ((0, blocks * ROW_BLOCK - m), (0, 0)))
    # Identical separate products, not one of blocks*ROW_BLOCK rows, and not a loop either: XLA
    # emits a product inside a while loop otherwise than the same product outside one.
    out = jnp.concatenate([_product(rows[i * ROW_BLOCK:(i + 1) * ROW_BLOCK], w, w_nk) for i in range(blocks)],
                          axis=0)
    return out[:m].reshape(*lead, -1)


def _product(x: jax.Array, w: jax.Array, w_nk: bool) -> jax.Array:
    """One product, in the dtype jnp.matmul gives.

    Operands of one narrow float dtype (bfloat16) are multiplied as stored and accumulated in
    float32 (`preferred_element_type`), rounded once. Asked for a bf16 *result*, XLA's CPU
    backend has no native dot: it rewrites the product into float32 and converts the whole
    weight inside every step (issue 33: bf16 decode 4.2-4.7x slower than float32). Asked for a
    float32 result, it hands the dot to its YNNPACK fusion, which reads the bf16 weight directly
    (also for a weight contracted on its last axis, the `[N, K]` layout, but not for a transpose
    op in front of the dot: hence `w_nk`). GPUs run this dot natively too (bf16 tensor cores,
    float32 accumulation, as a bf16 result did internally), so one formulation serves every
    platform and nothing depends on where the step is compiled.

    float32 (and mixed dtypes, which the model does not produce) keep jnp.matmul, float32 at
    Precision.HIGHEST: no TF32 or bf16 passes on GPU; the oracle tests compare it."""
    if x.dtype == w.dtype and w.dtype != jnp.float32 and jnp.issubdtype(w.dtype, jnp.floating):
        dims = (((x.ndim - 1,), (1 if w_nk else 0,)), ((), ()))
        return jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32).astype(w.dtype)
    precision = jax.lax.Precision.HIGHEST if w.dtype == jnp.float32 else None
    return jnp.matmul(x, w.T if w_nk else w, precision=precision)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Zero-centred RMSNorm: the stored weight is an offset from 1."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(_mean_square(x32) + eps)
    return (y * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def _mean_square(x32: jax.Array) -> jax.Array:
    """mean(x²) over the last axis, keepdims, as a tree sum (batch invariance, `tree_sum`)."""
    return (tree_sum(x32 * x32) / x32.shape[-1])[..., None]


def gated_rms_norm(x: jax.Array, z: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """The GDN output norm: plain weight (not 1+w), then gated by silu(z)."""
    x32 = x.astype(jnp.float32)
    y = (x32 * jax.lax.rsqrt(_mean_square(x32) + eps)).astype(x.dtype)
    y = (weight * y).astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
    return y.astype(x.dtype)


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(tree_sum(x32 * x32)[..., None] + eps)


# ---- rotary embedding -------------------------------------------------------------------

def rope_cos_sin(positions: jax.Array, cfg: ModelConfig, dtype, *,
                 triples: bool = False) -> tuple[jax.Array, jax.Array]:
    """cos/sin `[..., rotary_dim]` for integer positions `[...]`, or with `triples=True` for
    M-RoPE positions `[3, ...]` (axis 0 is t, h, w, as `rope_index` makes them).

    Layout (transformers' Qwen3.5 / Qwen2-VL recomposition): frequency j < rotary_dim/2 takes its
    position from axis a(j), then the halves repeat ([f, f], NeoX). With `mrope_section`
    (s_t, s_h, s_w) and `mrope_interleaved`, a(j) = h if j % 3 == 1 and j < 3*s_h, w if
    j % 3 == 2 and j < 3*s_w, else t; not interleaved, the sections are contiguous (s_t t's,
    then s_h h's, then s_w w's). With all three axes equal (text) this is bit-identical to the
    1-D path. A flag, not the shape, picks the mode: a leading axis of 3 may be a batch.
    """
    dim = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    if triples:
        section = cfg.mrope_section
        if section is None or positions.shape[:1] != (3,):
            raise ValueError(f"M-RoPE needs cfg.mrope_section and positions [3, ...]; got "
                             f"{section} and shape {positions.shape}")
        if cfg.mrope_interleaved:
            axis = [1 if j % 3 == 1 and j < 3 * section[1] else 2 if j % 3 == 2 and j < 3 * section[2]
                    else 0 for j in range(dim // 2)]
        else:
            axis = [a for a, n in enumerate(section) for _ in range(n)]
        freqs = jnp.moveaxis(positions.astype(jnp.float32), 0, -1)[..., jnp.asarray(axis)] * inv_freq
    else:
        freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x `[..., heads, head_dim]`; cos/sin `[..., rotary_dim]` (NeoX rotate-half, partial)."""
    dim = cos.shape[-1]
    cos, sin = cos[..., None, :], sin[..., None, :]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1)


# ---- gated full attention ---------------------------------------------------------------

def attention_project(p: dict, x: jax.Array, positions: jax.Array, cfg: ModelConfig, *, triples: bool = False):
    """x `[..., hidden]` → q `[..., Hq, D]`, k, v `[..., Hkv, D]` (normed, roped), gate `[..., Hq*D]`.
    `positions` `[...]`, or M-RoPE `[3, ...]` with `triples` (`rope_cos_sin`)."""
    lead = x.shape[:-1]
    d = cfg.head_dim
    qg = matmul(x, p["q_proj"]).reshape(*lead, cfg.num_attention_heads, 2 * d)
    q, gate = qg[..., :d], qg[..., d:]
    k = matmul(x, p["k_proj"]).reshape(*lead, cfg.num_key_value_heads, d)
    v = matmul(x, p["v_proj"]).reshape(*lead, cfg.num_key_value_heads, d)
    q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    cos, sin = rope_cos_sin(positions, cfg, x.dtype, triples=triples)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate.reshape(*lead, -1)


def attention_output(p: dict, o: jax.Array, gate: jax.Array) -> jax.Array:
    """o `[..., Hq, D]` → `[..., hidden]`, gated by sigmoid(gate)."""
    o = o.reshape(*o.shape[:-2], -1)
    o = (o.astype(jnp.float32) * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(gate.dtype)
    return matmul(o, p["o_proj"])


def dense_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The uncached reference: q `[T, Hq, D]`, k/v `[T, Hkv, D]` → `[T, Hq, D]`."""
    t, hq, d = q.shape
    groups = hq // k.shape[1]
    k = jnp.repeat(k, groups, axis=1)
    v = jnp.repeat(v, groups, axis=1)
    scores = jnp.einsum("thd,shd->hts", q.astype(jnp.float32), k.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) * (d ** -0.5)
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(mask[None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("hts,shd->thd", probs, v.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return out.astype(q.dtype)


# ---- Gated DeltaNet ---------------------------------------------------------------------

def gdn_project(p: dict, x: jax.Array, cfg: ModelConfig):
    """x `[..., hidden]` → mixed qkv `[..., conv_dim]`, z `[..., Hv, Dv]`, b, a `[..., Hv]`.

    Parameters are stored in the plain Qwen3.5 layout; Qwen3-Next's grouped projections are
    regrouped once at load time (weights.py).
    """
    lead = x.shape[:-1]
    z = matmul(x, p["in_proj_z"]).reshape(*lead, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
    return matmul(x, p["in_proj_qkv"]), z, matmul(x, p["in_proj_b"]), matmul(x, p["in_proj_a"])


def gdn_gates(p: dict, mixed: jax.Array, b: jax.Array, a: jax.Array, cfg: ModelConfig):
    """Post-conv `[..., conv_dim]` → q, k `[..., Hv, Dk]` (l2-normed, q scaled, heads expanded),
    v `[..., Hv, Dv]`, g and beta `[..., Hv]`, all float32."""
    lead = mixed.shape[:-1]
    kd, dk, dv = cfg.linear_key_dim, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    q = mixed[..., :kd].reshape(*lead, cfg.linear_num_key_heads, dk)
    k = mixed[..., kd:2 * kd].reshape(*lead, cfg.linear_num_key_heads, dk)
    v = mixed[..., 2 * kd:].reshape(*lead, cfg.linear_num_value_heads, dv).astype(jnp.float32)
    q = l2_normalize(q) * (dk ** -0.5)
    k = l2_normalize(k)
    # Each key head serves num_v/num_k consecutive value heads.
    ratio = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    if ratio > 1:
        q, k = jnp.repeat(q, ratio, axis=-2), jnp.repeat(k, ratio, axis=-2)
    g = -jnp.exp(p["A_log"].astype(jnp.float32)) * jax.nn.softplus(
        a.astype(jnp.float32) + p["dt_bias"].astype(jnp.float32))
    beta = jax.nn.sigmoid(b.astype(jnp.float32))
    return q, k, v, g, beta


def gdn_output(p: dict, o: jax.Array, z: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Core output `[..., Hv, Dv]` (float32) → `[..., hidden]`."""
    o = gated_rms_norm(o.astype(z.dtype), z, p["norm"], cfg.rms_norm_eps)
    return matmul(o.reshape(*o.shape[:-2], -1), p["out_proj"])


def conv_reference(x: jax.Array, weight: jax.Array) -> jax.Array:
    """Whole-sequence depthwise causal conv + SiLU: x `[T, C]`, weight `[C, K]` → `[T, C]`."""
    kernel = weight.shape[1]
    xx = jnp.concatenate([jnp.zeros((kernel - 1, x.shape[1]), x.dtype), x], axis=0).astype(jnp.float32)
    out = sum(xx[j:j + x.shape[0]] * weight[:, j].astype(jnp.float32) for j in range(kernel))
    return jax.nn.silu(out).astype(x.dtype)


def delta_rule_reference(q, k, v, g, beta):
    """Token-by-token gated delta rule from a zero state: q, k `[T, H, Dk]`, v `[T, H, Dv]`,
    g, beta `[T, H]` → o `[T, H, Dv]`, final state `[H, Dk, Dv]`; float32."""
    hp = jax.lax.Precision.HIGHEST

    def step(state, inp):
        q_t, k_t, v_t, g_t, b_t = inp
        state = state * jnp.exp(g_t)[:, None, None]
        kv = jnp.einsum("hk,hkv->hv", k_t, state, precision=hp)
        delta = (v_t - kv) * b_t[:, None]
        state = state + k_t[:, :, None] * delta[:, None, :]
        return state, jnp.einsum("hk,hkv->hv", q_t, state, precision=hp)

    h, dk, dv = q.shape[1], q.shape[2], v.shape[2]
    state, o = jax.lax.scan(step, jnp.zeros((h, dk, dv), jnp.float32), (q, k, v, g, beta))
    return o, state


# ---- feed-forward -----------------------------------------------------------------------

def dense_mlp(p: dict, x: jax.Array) -> jax.Array:
    return matmul(jax.nn.silu(matmul(x, p["gate_proj"])) * matmul(x, p["up_proj"]), p["down_proj"])


def moe(p: dict, x: jax.Array, cfg: ModelConfig, rows: jax.Array | None = None) -> jax.Array:
    """Top-k routed experts plus the sigmoid-gated shared expert; x `[..., hidden]`.

    Each token's k expert outputs come from `routed_experts` (tiles of one expert's
    assignments; work and bytes follow the experts used) and are weighted and summed in the
    order of k with explicit adds, so a token's result never depends on which tokens share the
    step (batch invariance, doctrine 1).

    `rows` (bool, `x.shape[:-1]`), where given, marks the real tokens: the others (a step's
    padding rows, a chunk's tokens past its length) are routed to no expert, so their tiles
    are not run; their routed output is 0. A padding row of the C = 1 decode bucket otherwise
    doubled the expert tiles (issue 33). A real token's result is the same either way: its
    tile products never read the other rows.
    """
    lead, hidden = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, hidden)
    n, top_k = flat.shape[0], cfg.num_experts_per_tok
    probs = softmax(matmul(flat, p["router"]).astype(jnp.float32))
    weights, experts = jax.lax.top_k(probs, top_k)  # [n, k]
    if rows is not None:  # NO_EXPERT sorts last and is counted in no expert's run
        experts = jnp.where(rows.reshape(-1, 1), experts, cfg.num_experts)
    if cfg.norm_topk_prob:
        weights = weights / tree_sum(weights)[..., None]
    weights = weights.astype(x.dtype)

    tile = EXPERT_ROWS if n < NATIVE_ROWS else prefill_expert_tile(n * top_k, cfg.num_experts)
    out = routed_experts(p, flat, experts, tile) * weights[..., None]  # [n, k, hidden]
    routed = out[:, 0]
    for j in range(1, top_k):
        routed = routed + out[:, j]

    if "shared_gate_proj" in p:
        shared = dense_mlp({"gate_proj": p["shared_gate_proj"], "up_proj": p["shared_up_proj"],
                            "down_proj": p["shared_down_proj"]}, flat)
        shared = jax.nn.sigmoid(matmul(flat, p["shared_expert_gate"]).astype(jnp.float32)) * shared
        routed = routed + shared.astype(flat.dtype)
    return routed.reshape(*lead, hidden)


# Rows of one expert product below NATIVE_ROWS tokens (decode and verify steps, whatever their
# row count: batch invariance). The products are bound by reading the expert's slice, not by
# their rows: 1, 2, 4 and 8 rows ran within 15% of each other at 2 and 8 tokens (64 experts of
# [1024, 256], top-8, CPU), 8 fastest at 40 tokens (a verify step).
EXPERT_ROWS = ROW_BLOCK


def prefill_expert_tile(assignments: int, num_experts: int) -> int:
    """Rows per expert product for NATIVE_ROWS tokens or more (a prefill chunk of one request,
    or the whole-sequence reference): about the mean assignments per expert, 8 to 64. Measured
    on 64 experts of [1024, 256] (CPU): 64 tokens x top-8 (8 an expert) fastest at 8-16 rows, 256
    tokens (32 an expert) at 16-32; a tile much larger than the groups computes padding."""
    mean = -(-assignments // num_experts)
    return min(64, max(EXPERT_ROWS, 1 << (mean - 1).bit_length()))


def routed_experts(p: dict, flat: jax.Array, experts: jax.Array, tile: int) -> jax.Array:
    """The routed experts' outputs, unweighted: flat `[n, hidden]`, experts `[n, k]` → `[n, k, hidden]`.

    Assignments (token, k) are sorted by expert, and each expert's run of them is cut into
    tiles of `tile` rows: the loop runs one tile at a time, `silu(x @ gate[e]) * (x @ up[e]) @
    down[e]` for the tile's expert e, read as it is stored (one `[hidden, I]` slice per tile).
    Work and bytes follow the tiles used: no expert tensor is relaid out or densified, which
    `ragged_dot`'s CPU lowering does (every expert transposed and multiplied, masked: decode at
    0.09-0.21x transformers on a Qwen3-Next-shaped MoE, issue 33; scripts/moe_bench.py).

    Batch invariance: every tile is the same `[tile, hidden] @ [hidden, I]` product (rows past
    the expert's run zeroed), a row's result in it depends neither on the other rows nor on its
    place (as for `matmul`'s ROW_BLOCK), and every row count runs the same loop, whose trip count
    (the tiles used) is data: XLA cannot unroll or drop it, so the product is emitted the same
    way at every bucket. Below NATIVE_ROWS tokens the tile is ROW_BLOCK.

    Differentiable (`HybridLM` fine-tuning): reverse mode cannot run through a loop of data-
    dependent length, so the gradient is that of `_grouped_experts`, the same function as
    grouped `ragged_dot` products (their transposes are the weights' and rows' gradients).
    """
    stored = (p["experts_gate"], p["experts_up"], p["experts_down"])
    return _tiled_experts(stored, flat, experts, tile)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tiled_experts(stored: tuple, flat: jax.Array, experts: jax.Array, tile: int) -> jax.Array:
    n, top_k = experts.shape
    hidden, num_experts = flat.shape[-1], stored[0].shape[0]
    a = n * top_k
    expert_of = experts.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(expert_of, stable=True)  # sorted position → assignment
    sizes = jnp.bincount(expert_of, length=num_experts).astype(jnp.int32)
    run_end = jnp.cumsum(sizes)
    tiles = -(-sizes // tile)
    tile_end = jnp.cumsum(tiles)
    # The schedule: each expert's tiles in turn, at most ceil(a/tile) + min(E, a) of them.
    t = jnp.arange(-(-a // tile) + min(num_experts, a), dtype=jnp.int32)
    tile_expert = jnp.searchsorted(tile_end, t, side="right", method="compare_all")  # no loop
    tile_expert = jnp.minimum(tile_expert, num_experts - 1).astype(jnp.int32)
    tile_start = run_end[tile_expert] - sizes[tile_expert] + tile * (t - (tile_end[tile_expert] - tiles[tile_expert]))
    tile_stop = run_end[tile_expert]
    rows = jnp.concatenate([flat[order // top_k], jnp.zeros((tile, hidden), flat.dtype)])  # sorted, + a tile of slack

    def body(i, out):
        # The barrier makes the expert tensors loop-variant: XLA's CPU backend slices a bfloat16
        # array through a float32 convert of the whole operand, and hoists that convert of every
        # expert tensor out of the loop unless the operand changes per iteration (float32 is
        # unaffected; the barrier costs nothing and runs for every dtype alike).
        (wg, wu, wd), e = jax.lax.optimization_barrier((stored, tile_expert[i]))
        start = tile_start[i]
        valid = (start + jnp.arange(tile) < tile_stop[i])[:, None]
        x = jnp.where(valid, jax.lax.dynamic_slice_in_dim(rows, start, tile), 0)
        h = (jax.nn.silu(_expert_product(x, wg[e])) * _expert_product(x, wu[e])).astype(flat.dtype)
        y = _expert_product(h, wd[e])
        old = jax.lax.dynamic_slice_in_dim(out, start, tile)
        return jax.lax.dynamic_update_slice_in_dim(out, jnp.where(valid, y, old), start, 0)

    # float32 results (the products' accumulation type), rounded to the model dtype once, after.
    out = jax.lax.fori_loop(0, tile_end[-1], body, jnp.zeros((a + tile, hidden), jnp.float32))
    position = jnp.zeros(a, jnp.int32).at[order].set(jnp.arange(a, dtype=jnp.int32))  # assignment → sorted
    return out[position].astype(flat.dtype).reshape(n, top_k, hidden)


def _grouped_experts(stored: tuple, flat: jax.Array, experts: jax.Array) -> jax.Array:
    """`_tiled_experts`' function as grouped products over all experts (`ragged_dot`, which XLA's
    CPU backend densifies: for gradients only)."""
    n, top_k = experts.shape
    expert_of = experts.reshape(-1)
    order = jnp.argsort(expert_of, stable=True)
    sizes = jnp.bincount(expert_of, length=stored[0].shape[0]).astype(jnp.int32)
    rows = flat[order // top_k]
    precision = jax.lax.Precision.HIGHEST if flat.dtype == jnp.float32 else None
    grouped = lambda x, w: jax.lax.ragged_dot(x, w, sizes, precision=precision,  # noqa: E731
                                              preferred_element_type=jnp.float32)
    h = (jax.nn.silu(grouped(rows, stored[0])) * grouped(rows, stored[1])).astype(flat.dtype)
    out = jnp.zeros((n * top_k, flat.shape[-1]), jnp.float32).at[order].set(grouped(h, stored[2]))
    return out.astype(flat.dtype).reshape(n, top_k, -1)


def _tiled_experts_fwd(stored, flat, experts, tile):
    return _tiled_experts(stored, flat, experts, tile), (stored, flat, experts)


def _tiled_experts_bwd(tile, residuals, cotangent):
    stored, flat, experts = residuals
    _, vjp = jax.vjp(lambda s, f: _grouped_experts(s, f, experts), stored, flat)
    return (*vjp(cotangent), None)


_tiled_experts.defvjp(_tiled_experts_fwd, _tiled_experts_bwd)


def _expert_product(x: jax.Array, w: jax.Array) -> jax.Array:
    """One tile's `[tile, K] @ [K, N]` → float32: float32 at Precision.HIGHEST (exactness, no
    TF32 on GPU); a narrow dtype as stored, accumulated in float32 (asked for a bf16 result,
    XLA's CPU backend converts the operands to float32 first)."""
    precision = jax.lax.Precision.HIGHEST if w.dtype == jnp.float32 else None
    return jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=jnp.float32)


def feed_forward(p: dict, x: jax.Array, kind: str, cfg: ModelConfig, rows: jax.Array | None = None) -> jax.Array:
    """The block's MLP; `rows` the real tokens (see `moe`; a dense MLP runs every row alike)."""
    return moe(p, x, cfg, rows) if kind == "moe" else dense_mlp(p, x)
