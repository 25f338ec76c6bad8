#!/usr/bin/env python
"""Train the built-in model's DFlash drafter (issue 35) and export it as a published drafter folder.

    JAX_PLATFORMS=cpu python scripts/train_builtin_dflash.py [--steps 1500] [--rollouts 512] \
        [--out ninfer_jax/builtin_model/dflash] [--seed 0]

Steps (ninfer_jax/train/dflash_train.py): prompts are token windows of the corpus the built-in
model was trained on (ninfer_jax/train/corpus.py; training documents for the data, held-out
documents for the figures), continued greedily by the engine on the shipped built-in model
(the target's own output is what its Verify units accept); the target's layer outputs at the
drafter's `target_layer_ids` over every rollout; AdamW on the drafter's weights alone (the
target's embeddings and head stay frozen); the held-out acceptance: the mean number of leading
drafts equal to the target's greedy tokens per Verify unit at k = 1, 3 and 7, over every frontier
of the rollouts' generated part. The export (`--out`): config.json, model.safetensors (float32)
and metrics.json; progress goes to stderr, the metrics to stdout as JSON.

`--steps`, `--rollouts` and `--seed` fix the run (the rollouts are greedy, the draws seeded).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository, when run from a checkout

PROMPT_TOKENS = 24
NEW_TOKENS = 104  # a rollout is 128 tokens


def _say(msg: str) -> None:
    print(f"[train dflash] {msg}", file=sys.stderr, flush=True)


def prompts(tokenizer, docs, n: int, rng: np.random.Generator) -> list[list[int]]:
    """`n` windows of PROMPT_TOKENS tokens at random places of random documents."""
    ids = [e.ids for e in tokenizer.encode_batch([d.text for d in docs], add_special_tokens=False)]
    ids = [x for x in ids if len(x) > PROMPT_TOKENS]
    out = []
    for _ in range(n):
        x = ids[rng.integers(len(ids))]
        s = int(rng.integers(0, len(x) - PROMPT_TOKENS + 1))
        out.append(list(x[s:s + PROMPT_TOKENS]))
    return out


def main(argv=None) -> dict:
    from ninfer_jax.train.dflash_train import TrainConfig

    d = TrainConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "ninfer_jax", "builtin_model", "dflash"))
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--rollouts", type=int, default=512, help="training rollouts (held-out: a eighth as many)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max_files", type=int, default=None, help="only the first stdlib files (quick trials)")
    a = p.parse_args(argv)

    import jax
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    from ninfer_jax import Engine, EngineConfig
    from ninfer_jax.model import builtin, dflash
    from ninfer_jax.model.model import load_model
    from ninfer_jax.train import corpus, dflash_train as D

    t0 = time.time()
    model = load_model(builtin.NAME)
    tok = Tokenizer.from_file(os.path.join(builtin.trained_folder(), "tokenizer.json"))
    c = corpus.load(a.max_files)
    rng = np.random.default_rng(a.seed)
    _say(f"corpus: {len(c.train)} training and {len(c.heldout)} held-out documents; rolling out "
         f"{a.rollouts} + {a.rollouts // 8} prompts of {PROMPT_TOKENS} tokens, {NEW_TOKENS} greedy tokens each")
    engine = Engine(EngineConfig(model=builtin.NAME, max_concurrency=8, max_context=256, progress=False))
    try:
        train = D.rollouts(engine, prompts(tok, c.train, a.rollouts, rng), NEW_TOKENS)
        held = D.rollouts(engine, prompts(tok, c.heldout, a.rollouts // 8, rng), NEW_TOKENS)
    finally:
        engine.close()
    shape = D.DrafterShape()
    raw = shape.config_json(model.config)
    dcfg = dflash.parse_dflash_config(raw)
    dflash.check_drafter_fits(dcfg, model.config)
    f_train, f_held = D.target_features(model, shape, train), D.target_features(model, shape, held)
    _say(f"rollouts and features ready in {time.time() - t0:.0f}s; training {a.steps} steps")
    tc = TrainConfig(steps=a.steps, seed=a.seed)
    params, losses = D.train(model, dcfg, train, f_train, tc)
    accepted = D.acceptance(model, dcfg, params, held, f_held, first=PROMPT_TOKENS)
    metrics = {"heldout_accepted_length": {f"k={k}": round(D.accepted_length(accepted, k), 4) for k in (1, 3, 7)},
               "heldout_frontiers": int(accepted.size), "losses": [round(x, 4) for x in losses],
               "train": dict(vars(a), **{"rollouts_tokens": int(train.size), "prompt_tokens": PROMPT_TOKENS,
                                         "new_tokens": NEW_TOKENS, "steps": tc.steps, "batch": tc.batch,
                                         "anchors": tc.anchors, "peak_lr": tc.peak_lr}),
               "corpus_sha256": c.digest, "seconds": round(time.time() - t0, 1),
               "python": platform.python_version(), "jax": jax.__version__}
    metrics["train"].pop("out")
    os.makedirs(a.out, exist_ok=True)
    save_file(dflash.hf_tensors(dcfg, params), os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    _say(f"exported to {a.out}: held-out accepted length {metrics['heldout_accepted_length']}")
    print(json.dumps(metrics))
    return metrics


if __name__ == "__main__":
    main()
