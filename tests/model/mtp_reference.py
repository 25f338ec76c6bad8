"""A float64 numpy reference of the MTP forward (issue 17), written from the formulas, not from
layers.py: zero-centred RMSNorm; fc over [norm(embed(t+1)), norm(final hidden t)], embedding
first; full-attention decoder layers (q_proj grouped per head as [q | gate], QK-norm, partial
NeoX RoPE, causal GQA attention, ·sigmoid(gate)); dense MLP or top-k MoE with the sigmoid-gated
shared expert; `mtp.norm`; the main lm head (tied: embed.T).

Parameters are the internal pytrees (`weights.param_shapes` / `mtp_shapes`: matmul weights
`[in, out]`), converted to float64 here.
"""
from __future__ import annotations

import numpy as np


def _f64(tree):
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_f64(v) for v in tree]
    return np.asarray(tree, dtype=np.float64)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x, positions, rotary_dim, theta):
    """x `[T, heads, D]`: NeoX rotate-half on the first rotary_dim dims."""
    inv = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = positions.astype(np.float64)[:, None] * inv[None, :]  # [T, rotary_dim/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = rotary_dim // 2
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def attention(p, x, positions, cfg):
    t = x.shape[0]
    hq, hkv, d, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    qg = (x @ p["q_proj"]).reshape(t, hq, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(t, hq * d)
    k = (x @ p["k_proj"]).reshape(t, hkv, d)
    v = (x @ p["v_proj"]).reshape(t, hkv, d)
    q = rope(rms_norm(q, p["q_norm"], eps), positions, cfg.rotary_dim, cfg.rope_theta)
    k = rope(rms_norm(k, p["k_norm"], eps), positions, cfg.rotary_dim, cfg.rope_theta)
    out = np.zeros((t, hq, d))
    causal = np.tril(np.ones((t, t), dtype=bool))
    for h in range(hq):
        kh = h // (hq // hkv)  # consecutive query heads share a kv head
        scores = np.where(causal, q[:, h] @ k[:, kh].T / np.sqrt(d), -np.inf)
        out[:, h] = softmax(scores) @ v[:, kh]
    return (out.reshape(t, hq * d) * sigmoid(gate)) @ p["o_proj"]


def mlp(p, x, cfg):
    if "router" not in p:
        return (silu(x @ p["gate_proj"]) * (x @ p["up_proj"])) @ p["down_proj"]
    probs = softmax(x @ p["router"])
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        top = np.argsort(-probs[i], kind="stable")[:cfg.num_experts_per_tok]
        w = probs[i, top]
        if cfg.norm_topk_prob:
            w = w / w.sum()
        for e, we in zip(top, w):
            out[i] += we * ((silu(x[i] @ p["experts_gate"][e]) * (x[i] @ p["experts_up"][e])) @ p["experts_down"][e])
    if "shared_gate_proj" in p:
        shared = (silu(x @ p["shared_gate_proj"]) * (x @ p["shared_up_proj"])) @ p["shared_down_proj"]
        out += sigmoid(x @ p["shared_expert_gate"]) * shared
    return out


def decoder_layer(p, x, positions, cfg):
    eps = cfg.rms_norm_eps
    x = x + attention(p, rms_norm(x, p["input_norm"], eps), positions, cfg)
    return x + mlp(p, rms_norm(x, p["post_norm"], eps), cfg)


def mtp_hidden_from_final(cfg, params, mtp, final, next_tokens, positions=None):
    """final `[T, H]` (after the main final norm), next_tokens `[T]` → the MTP output hidden
    `[T, H]` after `mtp.norm` (float64)."""
    params, mtp = _f64({"embed": params["embed"]}), _f64(mtp)
    final = np.asarray(final, np.float64)
    positions = np.arange(len(next_tokens)) if positions is None else np.asarray(positions)
    eps = cfg.rms_norm_eps
    e = rms_norm(params["embed"][np.asarray(next_tokens)], mtp["pre_fc_norm_embedding"], eps)
    h = rms_norm(final, mtp["pre_fc_norm_hidden"], eps)
    x = np.concatenate([e, h], axis=-1) @ mtp["fc"]
    for p in mtp["layers"]:
        x = decoder_layer(p, x, positions, cfg)
    return rms_norm(x, mtp["norm"], eps)


def head(cfg, params, x):
    w = np.asarray(params["embed"], np.float64).T if cfg.tie_word_embeddings else np.asarray(params["lm_head"], np.float64)
    return x @ w


def mtp_logits_from_final(cfg, params, mtp, final, next_tokens, positions=None):
    return head(cfg, params, mtp_hidden_from_final(cfg, params, mtp, final, next_tokens, positions))


def mtp_logits(cfg, params, mtp, hidden, next_tokens, positions=None):
    """As `HybridLM.mtp_logits`: `hidden` is the main residual stream before its final norm."""
    final = rms_norm(np.asarray(hidden, np.float64), np.asarray(params["norm"], np.float64), cfg.rms_norm_eps)
    return mtp_logits_from_final(cfg, params, mtp, final, next_tokens, positions)
