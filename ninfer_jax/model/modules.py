"""The model as flax nnx modules over the layer functions of layers.py (one copy of the math).

`HybridLM(cfg, params, mtp)` wraps the loader's pytree (`weights.param_shapes` layout) and,
optionally, the internal MTP pytree (`weights.mtp_shapes`). Each `DecoderLayer` holds one
`nnx.Param` per key of its layer dict, named as that key, so `to_params()` gives the pytrees
back unchanged. The whole-sequence `__call__` is the reference pass; the paged steps use the
layer methods for projections, outputs and the feed-forward, keeping their own mixer cores.

MTP convention (Qwen3-Next / Qwen3.5), checked against vLLM's `qwen3_next_mtp.py` and
`qwen3_next.py` (transformers implements no MTP forward; it only ignores `mtp.*`):
- `fc` is `Linear(2H → H)` (HF weight `[H, 2H]`) over
  `concat([pre_fc_norm_embedding(embed(token t+1)), pre_fc_norm_hidden(hidden_t)])`, embedding first;
- then `mtp.layers[k]`, full-attention decoder layers (MoE when the model has experts),
  then `mtp.norm` and the main model's lm head;
- the hidden vLLM feeds is the target model's output hidden, which is AFTER its final norm
  (vLLM's `Qwen3NextModel.forward` ends in `self.norm`, and `compute_logits` applies the head
  to that output directly). `HybridLM.__call__` returns the residual stream before the final
  norm, so `mtp_logits` applies the final norm first; `mtp_logits_from_final` takes the
  already-normed hidden (the steps' continuation hidden);
- positions: the MTP layer at index t (fed token t+1) uses position t, as vLLM's proposer does.
All norms are layers.rms_norm (zero-centred `1 + w`), as vLLM's GemmaRMSNorm for Qwen3-Next.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ninfer_jax.model import layers as L
from ninfer_jax.model.config import FULL, LINEAR, ModelConfig
from ninfer_jax.model.weights import mtp_mlp_kind, mtp_shapes, param_shapes

__all__ = ["DecoderLayer", "MTPHead", "HybridLM", "Merger", "split", "mtp_shapes", "init_params", "lm_head_logits"]


def _param(value) -> nnx.Param:
    return nnx.Param(jnp.asarray(value))


def lm_head_logits(embed: jax.Array, lm_head: jax.Array | None, x: jax.Array) -> jax.Array:
    """Final hidden `[..., H]` → float32 logits `[..., V]`; tied (`lm_head` None) uses embed.T."""
    if lm_head is None:  # embed [V, H] read as stored (a transpose in front costs bf16 its native dot)
        return L.matmul(x, embed, w_nk=True).astype(jnp.float32)
    return L.matmul(x, lm_head).astype(jnp.float32)


class DecoderLayer(nnx.Module):
    """One residual block: token mixer (GDN or gated attention) then feed-forward (dense or
    MoE). Its parameters are attributes named as the layer dict's keys."""

    def __init__(self, cfg: ModelConfig, kind: str, mlp_kind: str, params: dict):
        self.cfg = cfg
        self.kind = kind
        self.mlp_kind = mlp_kind
        self.names = tuple(params)  # static: the dict's keys, in its order
        for name, value in params.items():
            setattr(self, name, _param(value))

    def weights(self) -> dict:
        """{name: array} in the param dict layout (tracers inside a traced function)."""
        return {n: getattr(self, n)[...] for n in self.names}

    # ---- pieces shared by the whole-sequence pass and the paged steps --------------------
    def mixer_norm(self, x: jax.Array) -> jax.Array:
        return L.rms_norm(x, self.input_norm[...], self.cfg.rms_norm_eps)

    def attention_project(self, h: jax.Array, positions: jax.Array, triples: bool = False):
        return L.attention_project(self.weights(), h, positions, self.cfg, triples=triples)

    def attention_output(self, o: jax.Array, gate: jax.Array) -> jax.Array:
        return L.attention_output(self.weights(), o, gate)

    def gdn_project(self, h: jax.Array):
        return L.gdn_project(self.weights(), h, self.cfg)

    def gdn_gates(self, mixed: jax.Array, b: jax.Array, a: jax.Array):
        return L.gdn_gates(self.weights(), mixed, b, a, self.cfg)

    def gdn_output(self, o: jax.Array, z: jax.Array) -> jax.Array:
        return L.gdn_output(self.weights(), o, z, self.cfg)

    def feed_forward(self, x: jax.Array, rows: jax.Array | None = None) -> jax.Array:
        """The block's second half: `x + ffn(post_norm(x))`; `rows` the real tokens (a step's
        padding rows skip the routed experts: `layers.moe`)."""
        h = L.rms_norm(x, self.post_norm[...], self.cfg.rms_norm_eps)
        return x + L.feed_forward(self.weights(), h, self.mlp_kind, self.cfg, rows)

    # ---- whole sequence ----------------------------------------------------------------
    def mix(self, h: jax.Array, positions: jax.Array, triples: bool = False) -> jax.Array:
        """The uncached token mixer over `[T, H]`: conv + delta rule from a zero state, or dense
        causal attention (positions `[T]`, or M-RoPE `[3, T]` with `triples`)."""
        if self.kind == LINEAR:
            mixed, z, b, a = self.gdn_project(h)
            mixed = L.conv_reference(mixed, self.conv[...])
            q, k, v, g, beta = self.gdn_gates(mixed, b, a)
            o, _ = L.delta_rule_reference(q, k, v, g, beta)
            return self.gdn_output(o, z)
        q, k, v, gate = self.attention_project(h, positions, triples)
        return self.attention_output(L.dense_causal_attention(q, k, v), gate)

    def __call__(self, x: jax.Array, positions: jax.Array, triples: bool = False) -> jax.Array:
        x = x + self.mix(self.mixer_norm(x), positions, triples)
        return self.feed_forward(x)


class MTPHead(nnx.Module):
    """Qwen3-Next multi-token prediction: (hidden_t, token t+1) → the hidden predicting t+2."""

    def __init__(self, cfg: ModelConfig, mtp: dict):
        self.cfg = cfg
        self.pre_fc_norm_embedding = _param(mtp["pre_fc_norm_embedding"])
        self.pre_fc_norm_hidden = _param(mtp["pre_fc_norm_hidden"])
        self.fc = _param(mtp["fc"])
        self.layers = nnx.List([DecoderLayer(cfg, FULL, mtp_mlp_kind(cfg), p) for p in mtp["layers"]])
        self.norm = _param(mtp["norm"])

    def fuse(self, final_hidden: jax.Array, next_embeds: jax.Array) -> jax.Array:
        """The layers' input `[..., H]`: fc over [norm(embed t+1), norm(hidden t)], embedding first."""
        eps = self.cfg.rms_norm_eps
        e = L.rms_norm(next_embeds, self.pre_fc_norm_embedding[...], eps)
        h = L.rms_norm(final_hidden, self.pre_fc_norm_hidden[...], eps)
        return L.matmul(jnp.concatenate([e, h], axis=-1), self.fc[...])

    def out_norm(self, x: jax.Array) -> jax.Array:
        """`mtp.norm`: the output is the hidden for the lm head and for the next recursive draft."""
        return L.rms_norm(x, self.norm[...], self.cfg.rms_norm_eps)

    def __call__(self, final_hidden: jax.Array, next_embeds: jax.Array, positions: jax.Array) -> jax.Array:
        """final_hidden `[T, H]` (after the main final norm), next_embeds `[T, H]` → the normed
        MTP hidden `[T, H]`, ready for the lm head."""
        x = self.fuse(final_hidden, next_embeds)
        for layer in self.layers:
            x = layer(x, positions)
        return self.out_norm(x)

    def to_params(self) -> dict:
        return {"pre_fc_norm_embedding": self.pre_fc_norm_embedding[...],
                "pre_fc_norm_hidden": self.pre_fc_norm_hidden[...], "fc": self.fc[...],
                "layers": [layer.weights() for layer in self.layers], "norm": self.norm[...]}


class HybridLM(nnx.Module):
    """The whole model: embedding, decoder layers, final norm, lm head (tied or not), and the
    optional MTP head."""

    def __init__(self, cfg: ModelConfig, params: dict, mtp: dict | None = None):
        self.cfg = cfg
        self.embed = _param(params["embed"])
        self.layers = nnx.List([DecoderLayer(cfg, kind, cfg.mlp_types[i], params["layers"][i])
                                for i, kind in enumerate(cfg.layer_types)])
        self.norm = _param(params["norm"])
        self.lm_head = None if cfg.tie_word_embeddings else _param(params["lm_head"])
        self.mtp = None if mtp is None else MTPHead(cfg, mtp)

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        return self.embed[...][tokens]

    def final_norm(self, x: jax.Array) -> jax.Array:
        return L.rms_norm(x, self.norm[...], self.cfg.rms_norm_eps)

    def logits(self, final: jax.Array) -> jax.Array:
        """Final-normed hidden `[..., H]` → float32 logits `[..., V]`."""
        return lm_head_logits(self.embed[...], None if self.lm_head is None else self.lm_head[...], final)

    def __call__(self, tokens: jax.Array, embeds: jax.Array | None = None, positions: jax.Array | None = None,
                 triples: bool = False) -> tuple[jax.Array, jax.Array]:
        """tokens `[T]` → (logits `[T, V]` float32, hidden `[T, H]` before the final norm).

        `embeds` `[T, H]` replaces the token embeddings (the multimodal pass: the tower's tokens
        in the placeholders' rows); `positions` `[T]` (default arange), or M-RoPE `[3, T]` with
        `triples`, reach the attention layers' rope."""
        x = self.embed_tokens(tokens) if embeds is None else embeds
        if positions is None:
            positions = jnp.arange(tokens.shape[0])
        for layer in self.layers:
            x = layer(x, positions, triples)
        return self.logits(self.final_norm(x)), x

    def mtp_logits(self, hidden: jax.Array, next_tokens: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """hidden `[T, H]` from `__call__`, next_tokens `[T]` (token t+1 at index t) → float32
        logits `[T, V]` predicting token t+2; positions default to arange(T)."""
        return self.mtp_logits_from_final(self.final_norm(hidden), next_tokens, positions)

    def mtp_logits_from_final(self, final: jax.Array, next_tokens: jax.Array,
                              positions: jax.Array | None = None) -> jax.Array:
        """As `mtp_logits`, from the hidden after the final norm (what vLLM feeds the MTP head,
        and the steps' continuation hidden)."""
        if self.mtp is None:
            raise ValueError("this model has no MTP head (config mtp_num_hidden_layers is 0 or no mtp given)")
        if positions is None:
            positions = jnp.arange(next_tokens.shape[0])
        return self.logits(self.mtp(final, self.embed_tokens(next_tokens), positions))

    def to_params(self) -> tuple[dict, dict | None]:
        """Back to the (params, mtp) pytrees of arrays, for export (`weights.hf_tensors`)."""
        params = {"embed": self.embed[...], "norm": self.norm[...],
                  "layers": [layer.weights() for layer in self.layers]}
        if self.lm_head is not None:
            params["lm_head"] = self.lm_head[...]
        params = {k: params[k] for k in param_shapes(self.cfg)}  # the loader's key order
        return params, None if self.mtp is None else self.mtp.to_params()


# ---- the functional API: split once, merge inside jitted functions -------------------------

@dataclasses.dataclass(frozen=True)
class Merger:
    """The static half of `nnx.split`: graph and state structure. Hashable and equal across
    models of one config, so jitted functions taking it statically compile once per config."""

    graphdef: Any
    treedef: Any

    def __call__(self, leaves) -> HybridLM:
        """The module over `leaves` (tracers inside a jitted function)."""
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, list(leaves)))


def split(module: nnx.Module) -> tuple[Merger, tuple]:
    """`nnx.split` with the state flattened to a tuple of arrays: a tuple crosses into a
    compiled step as cheaply as the old params dict (no per-call Python flattening of nnx
    Variables)."""
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    return Merger(graphdef, treedef), tuple(leaves)


# ---- deterministic initial weights --------------------------------------------------------

def _draw(rng: np.random.Generator, name: str, shape: tuple, gdn: bool) -> np.ndarray:
    """One float64 leaf: fan-in scaled normals, zero-centred norm offsets around 0, the GDN output
    norm (a plain weight) around 1, A_log / dt_bias in their trained ranges."""
    if name == "A_log":
        return np.log(rng.uniform(1.0, 16.0, shape))
    if name == "dt_bias":
        return rng.uniform(-1.0, 1.0, shape)
    if name == "norm" and gdn:
        return rng.normal(1.0, 0.1, shape)
    if name.endswith("norm") or name.startswith("pre_fc_norm"):
        return rng.normal(0.0, 0.1, shape)
    if name == "embed":
        return rng.normal(0.0, 0.15, shape)
    fan_in = shape[-2] if len(shape) >= 2 else shape[0]
    return rng.normal(0.0, fan_in ** -0.5, shape)


def init_params(cfg: ModelConfig, seed: int, dtype=np.float32) -> tuple[dict, dict | None]:
    """Deterministic numpy weights for `cfg` (float32 unless `dtype`): (params, mtp), mtp None
    without MTP layers. Drawn in float64 and cast once (bfloat16 is rounded once). Draw order:
    top-level leaves, then the layers, then the MTP head, so adding MTP layers leaves the main
    weights unchanged."""
    rng = np.random.default_rng(seed)
    leaf = lambda n, s, gdn=False: _draw(rng, n, s, gdn).astype(dtype)  # noqa: E731
    shapes = param_shapes(cfg)
    params = {k: leaf(k, v) for k, v in shapes.items() if k != "layers"}
    params["layers"] = [{k: leaf(k, v, gdn=cfg.layer_types[i] == LINEAR) for k, v in layer.items()}
                        for i, layer in enumerate(shapes["layers"])]
    if not cfg.mtp_num_hidden_layers:
        return params, None
    ms = mtp_shapes(cfg)
    mtp = {k: leaf(k, v) for k, v in ms.items() if k != "layers"}
    mtp["layers"] = [{k: leaf(k, v) for k, v in layer.items()} for layer in ms["layers"]]
    return params, {k: mtp[k] for k in ms}


