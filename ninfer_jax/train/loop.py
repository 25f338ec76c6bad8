"""The training loop: optax AdamW with warm-up + cosine decay and global-norm clipping, a joint
next-token and MTP (next-next-token) loss, orbax checkpoints that resume exactly.

The model is the flax nnx `HybridLM` of ninfer_jax/model/modules.py (the layer math of
layers.py, whole-sequence reference path), built inside the traced loss from the plain
`{"params", "mtp"}` pytrees: the layout `init_params` makes, `to_params` returns and
`weights.hf_tensors` exports, so checkpoints and the export need no conversion. A batch is
`jax.vmap` of the per-sequence module call.

Loss per window (inputs x[0:T], targets x[1:T+1] and x[2:T+2]):
    mean CE(main logits_t, x[t+1]) + MTP_WEIGHT · mean CE(mtp logits_t, x[t+2])
where the MTP head at t sees the main hidden at t and token t+1 (the Qwen3-Next layout). The
MTP loss also trains the shared trunk, embeddings and head, as in DeepSeek-V3 / Qwen3-Next.

Determinism: initial weights come from the seed (`init_params`), data order from (seed, epoch)
(data.py), and a step is a pure function of (weights, optimizer state, batch, lr), so a run
stopped and resumed from a checkpoint reaches bit-identical parameters. The learning rate is
passed into each step (`optax.inject_hyperparams`) rather than traced from the schedule, so the
schedule length can be fixed after timing the first steps (`--minutes` without `--steps`)
without recompiling.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.modules import HybridLM, init_params
from ninfer_jax.train.data import Batches, Position


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 128  # the delta-rule scan is sequential: short windows, wide batches
    batch: int = 32
    steps: int | None = None  # schedule length; None: fixed from --minutes after timing steps
    peak_lr: float = 4e-3  # tiny models take large rates
    warmup_steps: int = 30
    end_lr_ratio: float = 0.1  # the cosine decays to peak_lr * this
    weight_decay: float = 0.1  # matrices and embeddings only, not norms or GDN decay params
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float = 1.0
    mtp_weight: float = 0.3  # λ of the next-next-token loss (DeepSeek-V3's early value)
    seed: int = 0
    save_every: int = 100
    log_every: int = 10
    calibration_steps: int = 8  # timed steps that fix `steps` in minutes mode

    def identity(self) -> dict:
        """The fields a resumed run must share with the checkpoint (not logging, not saving)."""
        d = dataclasses.asdict(self)
        for k in ("save_every", "log_every", "calibration_steps", "steps"):
            d.pop(k)
        return d


# ---- model, loss, optimizer -----------------------------------------------------------------

def init_weights(cfg: ModelConfig, seed: int) -> dict:
    params, mtp = init_params(cfg, seed)
    if mtp is None:
        raise ValueError("training needs an MTP head: set mtp_num_hidden_layers >= 1 in the config")
    return jax.tree.map(jnp.asarray, {"params": params, "mtp": mtp})


def window_terms(cfg: ModelConfig, weights: dict, window: jax.Array) -> dict:
    """Per-position terms of one window `[T + 2]`: main and MTP cross-entropy and top-1 hits."""
    model = HybridLM(cfg, weights["params"], weights["mtp"])
    x, nxt, nxt2 = window[:-2], window[1:-1], window[2:]
    logits, hidden = model(x)
    mtp_logits = model.mtp_logits(hidden, nxt)
    return {"ce": optax.softmax_cross_entropy_with_integer_labels(logits, nxt),
            "mtp_ce": optax.softmax_cross_entropy_with_integer_labels(mtp_logits, nxt2),
            "hit": (jnp.argmax(logits, -1) == nxt).astype(jnp.float32),
            "mtp_hit": (jnp.argmax(mtp_logits, -1) == nxt2).astype(jnp.float32)}


def batch_loss(cfg: ModelConfig, mtp_weight: float, weights: dict, batch: jax.Array):
    terms = jax.vmap(window_terms, in_axes=(None, None, 0))(cfg, weights, batch)
    ce, mtp_ce = jnp.mean(terms["ce"]), jnp.mean(terms["mtp_ce"])
    return ce + mtp_weight * mtp_ce, {"ce": ce, "mtp_ce": mtp_ce}


def _decay_mask(tree):
    return jax.tree.map(lambda x: x.ndim >= 2, tree)


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    """Clip by global norm, then AdamW whose learning rate is set per step (`with_lr`)."""
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))
    return optax.chain(optax.clip_by_global_norm(tc.clip_norm),
                       adamw(learning_rate=tc.peak_lr, b1=tc.b1, b2=tc.b2, weight_decay=tc.weight_decay,
                             mask=_decay_mask))


def with_lr(opt_state, lr):
    clip, adam = opt_state
    return clip, adam._replace(hyperparams={**adam.hyperparams, "learning_rate": jnp.asarray(lr, jnp.float32)})


def schedule(tc: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warm-up to `peak_lr`, cosine decay to `peak_lr · end_lr_ratio` at `total_steps`.
    Steps before the end of warm-up do not depend on `total_steps` (minutes-mode calibration)."""
    warmup = min(tc.warmup_steps, max(total_steps - 1, 0))
    fn = optax.warmup_cosine_decay_schedule(init_value=tc.peak_lr / max(tc.warmup_steps, 1), peak_value=tc.peak_lr,
                                            warmup_steps=warmup, decay_steps=max(total_steps, warmup + 1),
                                            end_value=tc.peak_lr * tc.end_lr_ratio)
    return lambda step: float(fn(step))


def make_step(cfg: ModelConfig, tc: TrainConfig):
    """The jitted training step `(weights, opt_state, batch, lr) -> (weights, opt_state, stats)`.
    Shared by every trainer with the same model and optimizer settings (one compile)."""
    return _step(cfg, tc.mtp_weight, dataclasses.replace(tc, steps=None, seed=0, save_every=1, log_every=1))


def _norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


@functools.lru_cache(maxsize=8)
def _step(cfg: ModelConfig, mtp_weight: float, tc: TrainConfig):
    tx = make_optimizer(tc)
    grad_fn = jax.value_and_grad(lambda w, b: batch_loss(cfg, mtp_weight, w, b), has_aux=True)

    @jax.jit
    def step(weights, opt_state, batch, lr):
        (loss, aux), grads = grad_fn(weights, batch)
        updates, opt_state = tx.update(grads, with_lr(opt_state, lr), weights)
        return optax.apply_updates(weights, updates), opt_state, {"loss": loss, **aux,
                                                                  "grad_norm": _norm(grads)}
    return step


# ---- evaluation -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def make_evaluator(cfg: ModelConfig):
    @jax.jit
    def sums(weights, batch, keep):
        terms = jax.vmap(window_terms, in_axes=(None, None, 0))(cfg, weights, batch)
        return {k: jnp.sum(v * keep[:, None]) for k, v in terms.items()}

    def evaluate(weights: dict, windows: np.ndarray, batch: int) -> dict:
        """Held-out figures over all `windows` (padded to whole batches, padding not counted)."""
        total = {"ce": 0.0, "mtp_ce": 0.0, "hit": 0.0, "mtp_hit": 0.0}
        for start in range(0, len(windows), batch):
            chunk = windows[start:start + batch]
            keep = np.zeros((batch,), np.float32)
            keep[:len(chunk)] = 1.0
            if len(chunk) < batch:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - len(chunk), axis=0)])
            out = sums(weights, jnp.asarray(chunk), jnp.asarray(keep))
            for k in total:
                total[k] += float(out[k])
        n = len(windows) * (windows.shape[1] - 2)
        if n == 0:
            raise ValueError("no held-out windows to evaluate")
        return {"heldout_tokens": n, "heldout_loss": total["ce"] / n, "heldout_perplexity": math.exp(total["ce"] / n),
                "heldout_top1": total["hit"] / n, "mtp_heldout_loss": total["mtp_ce"] / n,
                "mtp_top1": total["mtp_hit"] / n}
    return evaluate


# ---- checkpoints -------------------------------------------------------------------------------

class Checkpoints:
    """orbax CheckpointManager over `directory`: the weights and optimizer state (a PyTree item)
    plus a JSON item with the step, the data position and the run's identity."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, weights: dict, opt_state, meta: dict) -> None:
        if step in self.manager.all_steps():
            return  # already saved (a final save right after a periodic one)
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave({"weights": weights, "opt_state": opt_state}),
            meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore(self, weights_like: dict, opt_like, step: int | None = None):
        """(weights, opt_state, meta) of `step` (default the latest), shaped like the templates."""
        step = self.latest_step() if step is None else step
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore({"weights": weights_like, "opt_state": opt_like}),
            meta=ocp.args.JsonRestore()))
        return out.state["weights"], out.state["opt_state"], dict(out.meta)

    def close(self) -> None:
        self.manager.close()


# ---- the loop ------------------------------------------------------------------------------

def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


@dataclasses.dataclass
class RunState:
    weights: dict
    opt_state: object
    step: int
    position: Position
    total_steps: int | None
    tokens_seen: int
    train_seconds: float  # wall time spent in steps over all sessions (not compile or eval)


class Trainer:
    """Trains `cfg` on the token `stream`, checkpointing into `checkpoint_dir`; `identity`
    (corpus and tokenizer digests, the model config, ...) must match a checkpoint to resume it."""

    def __init__(self, cfg: ModelConfig, tc: TrainConfig, stream: np.ndarray, checkpoint_dir: str | None,
                 identity: dict | None = None, log: Callable[[str], None] | None = None):
        self.cfg, self.tc, self.stream = cfg, tc, stream
        self.identity = {"train": tc.identity(), **(identity or {})}
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.tx = make_optimizer(tc)
        self.step_fn = make_step(cfg, tc)
        self.history: list[dict] = []  # this session's per-step losses
        self.checkpoints = Checkpoints(checkpoint_dir) if checkpoint_dir else None
        self.state = self._start()
        self.batches = Batches(stream, tc.seq_len, tc.batch, tc.seed, self.state.position)

    def _fresh(self) -> RunState:
        weights = init_weights(self.cfg, self.tc.seed)
        return RunState(weights, self.tx.init(weights), 0, Position(), self.tc.steps, 0, 0.0)

    def _start(self) -> RunState:
        fresh = self._fresh()
        if self.checkpoints is None or self.checkpoints.latest_step() is None:
            return fresh
        weights, opt_state, meta = self.checkpoints.restore(fresh.weights, fresh.opt_state)
        if meta["identity"] != self.identity:
            diff = sorted(k for k in set(meta["identity"]) | set(self.identity)
                          if meta["identity"].get(k) != self.identity.get(k))
            raise ValueError(f"the checkpoint in the workdir belongs to another run (differs in {diff}); "
                             "use a new --workdir or the same settings")
        if self.tc.steps is not None and meta["total_steps"] is not None and self.tc.steps != meta["total_steps"]:
            raise ValueError(f"the checkpoint's schedule has {meta['total_steps']} steps, not {self.tc.steps}")
        self.log(f"[train] resuming from step {meta['step']} ({meta['tokens_seen']:,} tokens seen)")
        return RunState(weights, opt_state, meta["step"], Position(**meta["data"]), meta["total_steps"],
                        meta["tokens_seen"], meta["train_seconds"])

    def meta(self) -> dict:
        s = self.state
        return {"step": s.step, "data": s.position.as_dict(), "total_steps": s.total_steps,
                "tokens_seen": s.tokens_seen, "train_seconds": s.train_seconds, "identity": self.identity}

    def save(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.save(self.state.step, self.state.weights, self.state.opt_state, self.meta())

    def run(self, deadline: float | None = None, max_steps: int | None = None) -> dict:
        """Train until the schedule ends, `deadline` (time.time()) would be passed by the next
        step, or `max_steps` more steps are done; checkpoint every `save_every` steps and on
        leaving (also on Ctrl-C). Returns the last logged losses."""
        tc, s = self.tc, self.state
        if s.total_steps is None and deadline is None:
            raise ValueError("no schedule length: give TrainConfig.steps or a deadline")
        if s.total_steps is None and tc.warmup_steps <= tc.calibration_steps:
            raise ValueError("minutes mode times steps during warm-up: warmup_steps must exceed calibration_steps")
        # Until the length is fixed (minutes mode) only warm-up steps run, whose rates do not
        # depend on it: any length past the warm-up gives them.
        lr_of = schedule(tc, s.total_steps or tc.warmup_steps + 1)
        tokens_per_step = tc.batch * tc.seq_len
        window: list[dict] = []
        window_start, last = time.time(), {}
        timed: list[float] = []
        done_here = 0
        try:
            while s.total_steps is None or s.step < s.total_steps:
                if max_steps is not None and done_here >= max_steps:
                    break
                per_step = float(np.median(timed)) if timed else s.train_seconds / max(s.step, 1)
                if deadline is not None and (timed or s.step) and time.time() + per_step > deadline:
                    self.log(f"[train] time budget reached at step {s.step}")
                    break
                if s.total_steps is None and (len(timed) >= tc.calibration_steps or s.step + 1 >= tc.warmup_steps):
                    # 0.85: room for the machine's load to vary, so the schedule ends in time.
                    s.total_steps = s.step + max(1, int(0.85 * (deadline - time.time()) / max(per_step, 1e-6)))
                    lr_of = schedule(tc, s.total_steps)
                    self.log(f"[train] {per_step:.2f} s/step: the schedule runs {s.total_steps} steps")
                lr = lr_of(s.step)
                batch = jnp.asarray(self.batches.next())
                t0 = time.time()
                s.weights, s.opt_state, stats = self.step_fn(s.weights, s.opt_state, batch, lr)
                stats = jax.device_get(stats)
                dt = time.time() - t0
                if done_here:  # the first step of a session compiles
                    timed.append(dt)
                    s.train_seconds += dt
                s.step += 1
                done_here += 1
                s.position = self.batches.position
                s.tokens_seen += tokens_per_step
                window.append({k: float(v) for k, v in stats.items()})
                self.history.append(window[-1])
                if s.step % tc.log_every == 0 or s.step == s.total_steps:
                    last = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
                    elapsed = time.time() - window_start
                    rate = len(window) * tokens_per_step / max(elapsed, 1e-9)
                    left = "?" if s.total_steps is None else _clock(
                        (s.total_steps - s.step) * (np.median(timed) if timed else elapsed / len(window)))
                    self.log(f"[train] step {s.step}/{s.total_steps or '?'} loss {last['loss']:.3f} "
                             f"(next {last['ce']:.3f}, mtp {last['mtp_ce']:.3f}) |g| {last['grad_norm']:.2f} "
                             f"lr {lr:.2e} {rate:,.0f} tok/s ETA {left}")
                    window, window_start = [], time.time()
                if s.step % tc.save_every == 0:
                    self.save()
            if window:
                last = {k: float(np.mean([w[k] for w in window])) for k in window[0]}
        finally:
            self.save()
        return last
