#!/usr/bin/env python
"""Train the built-in hybrid model (builtin:tiny-hybrid's geometry plus one MTP layer) on the
English text that ships with Python, and export it as a Hugging Face folder.

    JAX_PLATFORMS=cpu python scripts/train_builtin.py --minutes 18 [--steps N] \
        [--workdir /tmp/ninfer_train_builtin] [--out DIR] [--seed 0]

Steps: the corpus (ninfer_jax/train/corpus.py: help topics and stdlib docstrings, split by
document); the tokenizer, retrained on the training split with the recipe of
scripts/make_builtin_tokenizer.py (1024 ids, the same added tokens at 1008..1023); the token
stream, cached in the workdir; training with orbax checkpoints in `<workdir>/checkpoints`
(a rerun with the same settings resumes from the latest one, bit-exactly); held-out perplexity
and MTP top-1 accuracy; the export (`--out`, default `<workdir>/export`): config.json,
model.safetensors, tokenizer files, chat template, metrics.json. The metrics are printed as
JSON on stdout, progress goes to stderr.

`--steps` fixes the schedule (deterministic for a seed); `--minutes` caps the wall time (the
run stops, checkpoints and exports; rerun to continue), and without `--steps` it also sets the
schedule's length from the time the first steps take (machine-dependent; the metrics record
the length, and `--steps` that many reproduces the run).

Measured (2 shared CPU cores, CPython 3.11.7, JAX 0.10.2): `--minutes 19` with the defaults
(hidden 64, 4 layers + 1 MTP layer, 282,632 parameters, 32 x 128 tokens a step, peak lr 4e-3)
fixed 605 steps, saw 2.48 M tokens and ended in 820 s wall; held-out perplexity 41.0, MTP
top-1 accuracy 0.241; the export is 1.2 MB.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository, when run from a checkout
sys.path.insert(0, HERE)

import make_builtin_tokenizer  # noqa: E402  (scripts/, the tokenizer recipe)

EXPORT_RESERVE_S = 60.0  # of a --minutes budget, kept for the held-out evaluation and export


def parse_args(argv=None) -> argparse.Namespace:
    from ninfer_jax.train.loop import TrainConfig

    d = TrainConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ninfer_train_builtin"),
                   help="tokenizer, token cache and orbax checkpoints (resumed when present)")
    p.add_argument("--out", default=None, help="export folder (default <workdir>/export)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--steps", type=int, default=None, help="schedule length in steps")
    p.add_argument("--minutes", type=float, default=None, help="wall-clock budget of this invocation")
    p.add_argument("--seq_len", type=int, default=d.seq_len)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--lr", type=float, default=d.peak_lr, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=d.warmup_steps)
    p.add_argument("--weight_decay", type=float, default=d.weight_decay)
    p.add_argument("--mtp_weight", type=float, default=d.mtp_weight, help="λ of the next-next-token loss")
    p.add_argument("--save_every", type=int, default=d.save_every)
    p.add_argument("--log_every", type=int, default=d.log_every)
    p.add_argument("--hidden_size", type=int, default=None, help="override builtin.HF_CONFIG's hidden size")
    p.add_argument("--intermediate_size", type=int, default=None, help="override the MLP size")
    p.add_argument("--max_files", type=int, default=None, help="only the first stdlib files (quick trials)")
    args = p.parse_args(argv)
    if args.steps is None and args.minutes is None:
        p.error("give --steps, --minutes or both")
    return args


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def prepare_tokenizer(folder: str, texts: list[str], corpus_digest: str) -> str:
    """The tokenizer trained on `texts`, made once per corpus in `folder` (with the built-in
    model's hand-written chat template, unchanged)."""
    stamp = os.path.join(folder, "corpus.sha256")
    if os.path.exists(stamp) and open(stamp).read().strip() == corpus_digest:
        return folder
    make_builtin_tokenizer.write(Path(folder), texts)
    from ninfer_jax.model import builtin

    shutil.copyfile(os.path.join(builtin.trained_folder(), "chat_template.jinja"),
                    os.path.join(folder, "chat_template.jinja"))
    with open(stamp, "w") as f:
        f.write(corpus_digest + "\n")
    return folder


def token_streams(workdir: str, tokenizer_dir: str, corpus) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out token streams, tokenised once and cached by corpus + tokenizer."""
    from tokenizers import Tokenizer

    from ninfer_jax.train.data import encode_documents

    key = hashlib.sha256((corpus.digest + sha256_file(os.path.join(tokenizer_dir, "tokenizer.json"))).encode())
    path = os.path.join(workdir, f"tokens-{key.hexdigest()[:16]}.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            return z["train"], z["heldout"]
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    train = encode_documents(tok, [d.text for d in corpus.train])
    heldout = encode_documents(tok, [d.text for d in corpus.heldout])
    np.savez(path + ".tmp.npz", train=train, heldout=heldout)
    os.replace(path + ".tmp.npz", path)
    return train, heldout


def main(argv=None) -> dict:
    t_start = time.time()
    args = parse_args(argv)
    import jax

    from ninfer_jax.model import builtin
    from ninfer_jax.model.config import parse_config
    from ninfer_jax.train import corpus as corpus_mod
    from ninfer_jax.train.data import windows
    from ninfer_jax.train.export import export, folder_bytes, hf_config
    from ninfer_jax.train.loop import TrainConfig, Trainer, make_evaluator

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    deadline = None if args.minutes is None else t_start + 60.0 * args.minutes - EXPORT_RESERVE_S
    os.makedirs(args.workdir, exist_ok=True)
    out = args.out or os.path.join(args.workdir, "export")

    base = dict(builtin.HF_CONFIG)
    if args.hidden_size:
        base["hidden_size"] = args.hidden_size
    if args.intermediate_size:
        base["intermediate_size"] = args.intermediate_size
    config_json = hf_config(base, mtp_layers=1, dtype="float32")
    cfg = parse_config(config_json)

    corpus = corpus_mod.load(args.max_files)
    log(f"[train] {corpus.describe()} ({platform.python_version()})")
    tok_dir = prepare_tokenizer(os.path.join(args.workdir, "tokenizer"), [d.text for d in corpus.train], corpus.digest)
    train_stream, heldout_stream = token_streams(args.workdir, tok_dir, corpus)
    log(f"[train] tokens: {len(train_stream):,} training, {len(heldout_stream):,} held-out")

    tc = TrainConfig(seq_len=args.seq_len, batch=args.batch, steps=args.steps, peak_lr=args.lr,
                     warmup_steps=args.warmup, weight_decay=args.weight_decay, mtp_weight=args.mtp_weight,
                     seed=args.seed, save_every=args.save_every, log_every=args.log_every)
    identity = {"model": config_json, "corpus": corpus.digest,
                "tokenizer": sha256_file(os.path.join(tok_dir, "tokenizer.json"))}
    trainer = Trainer(cfg, tc, train_stream, os.path.join(args.workdir, "checkpoints"), identity, log=log)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.state.weights))
    log(f"[train] {n_params:,} parameters (MTP head included); {tc.batch} x {tc.seq_len} tokens a step")
    last = trainer.run(deadline=deadline)
    s = trainer.state

    log("[train] evaluating on the held-out documents")
    figures = make_evaluator(cfg)(s.weights, windows(heldout_stream, tc.seq_len), tc.batch)
    metrics = {**figures, "steps": s.step, "total_steps": s.total_steps, "complete": s.step == s.total_steps,
               "tokens_seen": s.tokens_seen, "train_seconds": round(s.train_seconds, 1),
               "wall_seconds_this_run": round(time.time() - t_start, 1), "last_train_loss": last,
               "seed": tc.seed, "train_config": tc.identity(), "parameters": n_params,
               "corpus": {"documents": [len(corpus.train), len(corpus.heldout)],
                          "characters": list(corpus.chars), "tokens": [len(train_stream), len(heldout_stream)],
                          "sha256": corpus.digest, "python": platform.python_version()},
               "tokenizer_sha256": identity["tokenizer"], "jax": jax.__version__}
    export(out, s.weights, cfg, config_json, tok_dir, metrics)
    trainer.checkpoints.close()
    log(f"[train] exported {out} ({folder_bytes(out) / 1e6:.2f} MB) in {time.time() - t_start:.0f} s: "
        f"held-out perplexity {figures['heldout_perplexity']:.2f}, MTP top-1 {figures['mtp_top1']:.3f}")
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
