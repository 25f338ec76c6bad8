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


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x `[..., K]` @ w `[K, N]`: full precision for float32 (exactness), native for bfloat16;
    batch-invariant below NATIVE_ROWS rows (ROW_BLOCK)."""
    precision = jax.lax.Precision.HIGHEST if w.dtype == jnp.float32 else None
    lead, k = x.shape[:-1], x.shape[-1]
    m = math.prod(lead)
    if m >= NATIVE_ROWS:
        return jnp.matmul(x, w, precision=precision)
    blocks = -(-m // ROW_BLOCK)
    rows = jnp.pad(x.reshape(m, k), ((0, blocks * ROW_BLOCK - m), (0, 0)))

    def block(r):
        return jnp.matmul(r, w, precision=precision)

    # Identical separate products, not one of blocks*ROW_BLOCK rows, and not a loop either: XLA
    # emits a product inside a while loop otherwise than the same product outside one.
    out = jnp.concatenate([block(rows[i * ROW_BLOCK:(i + 1) * ROW_BLOCK]) for i in range(blocks)], axis=0)
    return out[:m].reshape(*lead, w.shape[-1])


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

def rope_cos_sin(positions: jax.Array, cfg: ModelConfig, dtype) -> tuple[jax.Array, jax.Array]:
    """cos/sin `[..., rotary_dim]` for integer positions `[...]`.

    Qwen3.5's interleaved M-RoPE gives every frequency the same text position when the three
    grid axes are equal (text-only input), so it reduces to this 1-D RoPE.
    """
    dim = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
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

def attention_project(p: dict, x: jax.Array, positions: jax.Array, cfg: ModelConfig):
    """x `[..., hidden]` → q `[..., Hq, D]`, k, v `[..., Hkv, D]` (normed, roped), gate `[..., Hq*D]`."""
    lead = x.shape[:-1]
    d = cfg.head_dim
    qg = matmul(x, p["q_proj"]).reshape(*lead, cfg.num_attention_heads, 2 * d)
    q, gate = qg[..., :d], qg[..., d:]
    k = matmul(x, p["k_proj"]).reshape(*lead, cfg.num_key_value_heads, d)
    v = matmul(x, p["v_proj"]).reshape(*lead, cfg.num_key_value_heads, d)
    q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
    k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    cos, sin = rope_cos_sin(positions, cfg, x.dtype)
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


def moe(p: dict, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Top-k routed experts plus the sigmoid-gated shared expert; x `[..., hidden]`.

    Assignments are sorted by expert and run as grouped matmuls (`ragged_dot`), so work is
    proportional to top-k, not to the number of experts.
    """
    lead, hidden = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, hidden)
    n, top_k, num_experts = flat.shape[0], cfg.num_experts_per_tok, cfg.num_experts
    probs = softmax(matmul(flat, p["router"]).astype(jnp.float32))
    weights, experts = jax.lax.top_k(probs, top_k)  # [n, k]
    if cfg.norm_topk_prob:
        weights = weights / tree_sum(weights)[..., None]
    weights = weights.astype(x.dtype)

    expert_of = experts.reshape(-1)  # [n*k]
    order = jnp.argsort(expert_of, stable=True)
    token_of = order // top_k
    rows = flat[token_of]
    sizes = jnp.bincount(expert_of, length=num_experts).astype(jnp.int32)
    precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    gate = jax.lax.ragged_dot(rows, p["experts_gate"], sizes, precision=precision)
    up = jax.lax.ragged_dot(rows, p["experts_up"], sizes, precision=precision)
    out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, p["experts_down"], sizes, precision=precision)
    out = out * weights.reshape(-1)[order][:, None]
    routed = jnp.zeros_like(flat).at[token_of].add(out)

    if "shared_gate_proj" in p:
        shared = dense_mlp({"gate_proj": p["shared_gate_proj"], "up_proj": p["shared_up_proj"],
                            "down_proj": p["shared_down_proj"]}, flat)
        shared = jax.nn.sigmoid(matmul(flat, p["shared_expert_gate"]).astype(jnp.float32)) * shared
        routed = routed + shared.astype(flat.dtype)
    return routed.reshape(*lead, hidden)


def feed_forward(p: dict, x: jax.Array, kind: str, cfg: ModelConfig) -> jax.Array:
    return moe(p, x, cfg) if kind == "moe" else dense_mlp(p, x)
