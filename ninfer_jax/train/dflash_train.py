"""A DFlash drafter trained for a target model by distillation (issue 35): the built-in model's
shipped drafter (`scripts/train_builtin_dflash.py`).

What the drafter must predict is what the engine verifies: the target's own greedy
continuation. So the data are the target's greedy rollouts (`rollouts`: corpus prompts
continued by the engine itself), and a training example is exactly one engine draft
(dflash_steps.draft): for a rollout x and a frontier n, the context is the target's layer
outputs at positions 0..n-1 (`target_features`, the layers `target_layer_ids` names, as the
engine's `capture=` gives them), the block is [x[n], mask × (B-1)] at positions n..n+B-1, and
the labels are x[n+1..n+B-1]. The block's hidden states go through the TARGET's head (tied to
its embeddings in the built-in model), frozen; only the drafter's own weights train.

Loss: cross-entropy per block position, weighted exp(-(j-1)/DECAY) for the j-th draft (an
accepted run stops at its first miss, so the early drafts matter most; DFlash's recipe). Every
step draws `anchors` frontiers per rollout; the context K/V is computed once per rollout
(`dflash.context_kv`) and masked to 0..n-1 for each frontier.

`acceptance` measures what the engine would accept greedily: per frontier, how many of the
block's leading drafts equal the rollout (0..B-1), averaged; `accepted_length(k)` caps it at k.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ninfer_jax.model import dflash
from ninfer_jax.model.steps import layer_outputs
from ninfer_jax.model.weights import is_shape

DECAY = 4.0  # the loss weight of the j-th draft: exp(-(j-1)/DECAY)


@dataclasses.dataclass(frozen=True)
class DrafterShape:
    """The drafter's geometry (a Qwen3 DFlashDraftModel config)."""

    layers: int = 1
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    block_size: int = 8
    target_layer_ids: tuple[int, ...] = (1, 3)
    mask_token_id: int = 1023  # <|reserved_6|> of the built-in tokenizer: never generated

    def config_json(self, target) -> dict:
        """The published layout's config.json for a drafter of `target` (a ModelConfig)."""
        return {"architectures": [dflash.ARCHITECTURE], "model_type": "qwen3", "hidden_size": target.hidden_size,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.intermediate, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                "vocab_size": target.vocab_size, "max_position_embeddings": target.max_position_embeddings,
                "tie_word_embeddings": False, "dtype": "float32", "num_target_layers": len(target.layer_types),
                "dflash_config": {"mask_token_id": self.mask_token_id,
                                  "target_layer_ids": list(self.target_layer_ids), "block_size": self.block_size}}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1200
    batch: int = 16  # rollouts a step
    anchors: int = 48  # frontiers drawn per rollout a step
    peak_lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    seed: int = 0
    log_every: int = 100


def rollouts(engine, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
    """`[N, len(prompt) + new_tokens]`: each prompt and the target's greedy continuation, from
    `engine` (an Engine on the target; all prompts the same length)."""
    from ninfer_jax import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    handles = [engine.submit(p, sp) for p in prompts]
    return np.asarray([list(p) + list(h.result().token_ids) for p, h in zip(prompts, handles)], np.int32)


def target_features(model, shape: DrafterShape, seqs: np.ndarray, batch: int = 32) -> np.ndarray:
    """`[N, T, n·H]` float32: the target's outputs of `target_layer_ids` at every position of
    every sequence (the whole-sequence forward; the engine's `capture=` gives the same)."""
    merger, leaves = model.functional
    cfg = model.config

    @jax.jit
    def one(tokens):
        lm = merger(leaves)
        x = lm.embed_tokens(tokens)
        positions = jnp.arange(tokens.shape[0])
        outs = {}
        for i, layer in enumerate(lm.layers):
            x = layer(x, positions)
            outs[i] = x
        return layer_outputs(outs, lm.final_norm(x), shape.target_layer_ids, len(cfg.layer_types))

    batched = jax.jit(jax.vmap(one))
    return np.concatenate([np.asarray(batched(jnp.asarray(seqs[i:i + batch])), np.float32)
                           for i in range(0, len(seqs), batch)])


def init_drafter(dcfg: dflash.DFlashConfig, seed: int) -> dict:
    """Random float32 params in `load_drafter`'s layout: norms 1, matrices normal / sqrt(fan-in)."""
    rng = np.random.default_rng(seed)

    def leaf(shape):
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)

    return jax.tree.map(leaf, dflash.param_shapes(dcfg), is_leaf=is_shape)


def _block_logits(dparams, dcfg, head, embeds_of, feats, seq, anchors):
    """Logits `[A, B-1, V]` of the blocks at `anchors` `[A]` of one rollout."""
    t = seq.shape[0]
    positions = jnp.arange(t, dtype=jnp.int32)
    ctx_k, ctx_v = dflash.context_kv(dparams, dcfg, feats, positions)
    bs = dcfg.block_size
    offsets = jnp.arange(bs, dtype=jnp.int32)

    def one(n):
        block = jnp.concatenate([seq[n][None], jnp.full((bs - 1,), dcfg.mask_token_id, seq.dtype)])
        hidden = dflash.draft_block(dparams, dcfg, ctx_k, ctx_v, n, embeds_of(block), n + offsets, positions)
        return dflash.scale_logits(dcfg, head(hidden[1:]))

    return jax.vmap(one)(anchors)


def _labels(seq, anchors, bs):
    return seq[anchors[:, None] + jnp.arange(1, bs)[None, :]]


def _loss_fn(dcfg, head, embeds_of):
    """The weighted block loss of params over (features, rollouts, anchors) batches."""
    weights = jnp.exp(-jnp.arange(dcfg.block_size - 1, dtype=jnp.float32) / DECAY)
    weights = weights / weights.sum()

    def loss_fn(dparams, feats, seqs, anchors):
        logits = jax.vmap(lambda f, s, a: _block_logits(dparams, dcfg, head, embeds_of, f, s, a))(feats, seqs, anchors)
        labels = jax.vmap(lambda s, a: _labels(s, a, dcfg.block_size))(seqs, anchors)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [N, A, B-1]
        return (ce.mean(axis=(0, 1)) * weights).sum()

    return loss_fn


def loss(model, dcfg: dflash.DFlashConfig, params: dict, seqs: np.ndarray, feats: np.ndarray, first: int = 1) -> float:
    """The training loss over every frontier n >= `first` of every rollout."""
    head, embeds_of = _head_and_embed(model)
    anchors = np.arange(first, seqs.shape[1] - dcfg.block_size + 1, dtype=np.int32)
    fn = jax.jit(_loss_fn(dcfg, head, embeds_of))
    return float(fn(jax.tree.map(jnp.asarray, params), jnp.asarray(feats), jnp.asarray(seqs),
                    jnp.asarray(np.broadcast_to(anchors, (len(seqs), len(anchors))))))


def make_step(dcfg, head, embeds_of, optimizer):
    loss_fn = _loss_fn(dcfg, head, embeds_of)

    @jax.jit
    def step(dparams, opt_state, feats, seqs, anchors):
        loss, grads = jax.value_and_grad(loss_fn)(dparams, feats, seqs, anchors)
        updates, opt_state = optimizer.update(grads, opt_state, dparams)
        return optax.apply_updates(dparams, updates), opt_state, loss

    return step


def _head_and_embed(model):
    lm = model.functional[0](model.functional[1])
    return lm.logits, lm.embed_tokens


def train(model, dcfg: dflash.DFlashConfig, seqs: np.ndarray, feats: np.ndarray, tc: TrainConfig,
          progress=sys.stderr) -> tuple[dict, list[float]]:
    """Trained params (numpy, float32) and the loss every `log_every` steps."""
    head, embeds_of = _head_and_embed(model)
    schedule = optax.warmup_cosine_decay_schedule(0.0, tc.peak_lr, tc.warmup_steps, tc.steps, tc.peak_lr * 0.1)
    optimizer = optax.chain(optax.clip_by_global_norm(tc.clip_norm),
                            optax.adamw(schedule, weight_decay=tc.weight_decay))
    params = jax.tree.map(jnp.asarray, init_drafter(dcfg, tc.seed))
    opt_state = optimizer.init(params)
    step = make_step(dcfg, head, embeds_of, optimizer)
    rng = np.random.default_rng(tc.seed)
    t, bs = seqs.shape[1], dcfg.block_size
    losses, start = [], time.perf_counter()
    for i in range(tc.steps):
        rows = rng.choice(len(seqs), tc.batch, replace=False)
        anchors = rng.integers(1, t - bs + 1, (tc.batch, tc.anchors)).astype(np.int32)
        params, opt_state, loss = step(params, opt_state, jnp.asarray(feats[rows]), jnp.asarray(seqs[rows]),
                                       jnp.asarray(anchors))
        if (i + 1) % tc.log_every == 0 or i + 1 == tc.steps:
            losses.append(float(loss))
            print(f"[dflash train] step {i + 1}/{tc.steps}  loss {float(loss):.3f}  "
                  f"{time.perf_counter() - start:.0f}s", file=progress, flush=True)
    return jax.tree.map(np.asarray, params), losses


def acceptance(model, dcfg: dflash.DFlashConfig, params: dict, seqs: np.ndarray, feats: np.ndarray,
               first: int = 1) -> np.ndarray:
    """`[N, F]` leading drafts that equal the rollout (0..B-1), at every frontier n >= `first`
    with a whole block inside the rollout."""
    head, embeds_of = _head_and_embed(model)
    bs = dcfg.block_size
    anchors = jnp.arange(first, seqs.shape[1] - bs + 1, dtype=jnp.int32)
    dparams = jax.tree.map(jnp.asarray, params)

    @jax.jit
    def one(f, s):
        drafts = jnp.argmax(_block_logits(dparams, dcfg, head, embeds_of, f, s, anchors), axis=-1)
        hit = drafts == _labels(s, anchors, bs)
        return jnp.cumprod(hit.astype(jnp.int32), axis=-1).sum(axis=-1)

    return np.stack([np.asarray(one(jnp.asarray(f), jnp.asarray(s))) for f, s in zip(feats, seqs)])


def accepted_length(accepted: np.ndarray, k: int) -> float:
    """Mean drafts accepted per Verify unit at k drafts (greedy, every frontier alike)."""
    return float(np.minimum(accepted, k).mean())
