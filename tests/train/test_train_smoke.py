"""Training smoke tests (issue 16): the corpus is deterministic, a few steps on a tiny slice lower
the loss, orbax save/restore is exact and an interrupted run resumed equals an uninterrupted
one, and the exported folder loads through the normal loader with the training module's
logits. The full training run is scripts/train_builtin.py, not a test."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model import builtin, load_model
from ninfer_jax.model.config import parse_config
from ninfer_jax.model.modules import HybridLM
from ninfer_jax.model.weights import mtp_params
from ninfer_jax.train import corpus
from ninfer_jax.train.data import Batches, Position, encode_documents, windows
from ninfer_jax.train.export import export, hf_config
from ninfer_jax.train.loop import Checkpoints, TrainConfig, Trainer, make_evaluator

REPO = Path(__file__).resolve().parents[2]
BUILTIN_TOKENIZER = REPO / "ninfer_jax" / "builtin_model"
# The built-in family at half depth (one GDN and one attention layer, plus the MTP layer): the
# same code paths as the real run, half the compile time.
CONFIG_JSON = hf_config({**builtin.HF_CONFIG, "num_hidden_layers": 2,
                         "layer_types": ["linear_attention", "full_attention"]})
CFG = parse_config(CONFIG_JSON)
TC = TrainConfig(seq_len=32, batch=4, steps=6, peak_lr=1e-2, warmup_steps=2, seed=3, save_every=100, log_every=100)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _equal(a, b) -> bool:
    same = jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(jax.tree.leaves(same))


@pytest.fixture(scope="module")
def small_corpus():
    return corpus.load(max_files=2)


@pytest.fixture(scope="module")
def tokenizer_dir(small_corpus, tmp_path_factory):
    """The tokenizer recipe retrained on a slice of the corpus (the help topics)."""
    out = tmp_path_factory.mktemp("tokenizer")
    texts = [d.text for d in small_corpus.train if d.id.startswith("topic:")]
    _script("make_builtin_tokenizer").write(out, texts)
    (out / "chat_template.jinja").write_bytes((BUILTIN_TOKENIZER / "chat_template.jinja").read_bytes())
    return out


@pytest.fixture(scope="module")
def stream(small_corpus, tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return encode_documents(tok, [d.text for d in small_corpus.train[:3]])[:2000]  # a tiny slice


def test_corpus_is_deterministic_and_split_by_document(small_corpus):
    again = corpus.load(max_files=2)
    assert again.digest == small_corpus.digest and again.train == small_corpus.train
    train_ids = {d.id for d in small_corpus.train}
    held_ids = {d.id for d in small_corpus.heldout}
    assert small_corpus.heldout and not train_ids & held_ids
    assert all(corpus.is_heldout(i) for i in held_ids) and not any(corpus.is_heldout(i) for i in train_ids)
    assert [d.id for d in small_corpus.train] == sorted(train_ids)
    assert any(d.id == "topic:if" for d in small_corpus.train + small_corpus.heldout)
    assert corpus.clean("Title\n=====\n\nText :func:`len`.\n>>> 1 + 1\n2\n\n\n\nEnd") == "Title\n\nText len.\n\nEnd"
    # Hard-wrapped prose becomes one line; code and lists keep their lines.
    assert (corpus.clean("A wrapped\nline.  Two.\n\n   code\n   more\n\n- one\n- two")
            == "A wrapped line. Two.\n\n   code\n   more\n\n- one\n- two")


def test_retrained_tokenizer_keeps_the_ids_and_added_tokens(tokenizer_dir):
    ours = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    shipped = json.loads((BUILTIN_TOKENIZER / "tokenizer.json").read_text())
    assert ours["added_tokens"] == shipped["added_tokens"]
    assert len(ours["model"]["vocab"]) == 1008 and ours["model"]["merges"] != shipped["model"]["merges"]
    for name in ("tokenizer_config.json", "generation_config.json"):
        assert (tokenizer_dir / name).read_text() == (BUILTIN_TOKENIZER / name).read_text()


def test_batches_are_deterministic_per_seed_and_epoch(stream):
    a, b = Batches(stream, 32, 4, seed=1), Batches(stream, 32, 4, seed=1)
    first = [a.next() for _ in range(30)]  # crosses into the second epoch
    assert all(np.array_equal(x, b.next()) for x in first)
    assert first[0].shape == (4, 34) and a.position.epoch >= 1
    c = Batches(stream, 32, 4, seed=1)
    for _ in range(7):
        c.next()
    saved = Position(**json.loads(json.dumps(c.position.as_dict())))  # as a checkpoint keeps it
    assert np.array_equal(Batches(stream, 32, 4, seed=1, position=saved).next(), first[7])
    assert not np.array_equal(Batches(stream, 32, 4, seed=2).next(), first[0])
    w = windows(stream, 32)
    assert np.array_equal(w[1, :2], w[0, 32:])  # targets continue across windows


def test_few_steps_lower_the_loss_and_resume_is_exact(stream, tokenizer_dir, tmp_path):
    whole = Trainer(CFG, TC, stream, str(tmp_path / "whole"), identity={"test": 1}, log=lambda line: None)
    whole.run()
    losses = [h["loss"] for h in whole.history]
    assert len(losses) == TC.steps and losses[-1] < losses[0] - 0.5, losses
    assert whole.state.step == TC.steps and whole.state.tokens_seen == TC.steps * TC.batch * TC.seq_len

    # Interrupted after 2 steps, then resumed by a new trainer from the orbax checkpoint.
    cut = Trainer(CFG, TC, stream, str(tmp_path / "cut"), identity={"test": 1}, log=lambda line: None)
    cut.run(max_steps=2)
    ckpt = Checkpoints(str(tmp_path / "cut"))
    assert ckpt.latest_step() == 2
    weights, opt_state, meta = ckpt.restore(cut.state.weights, cut.state.opt_state)
    assert _equal(weights, cut.state.weights) and _equal(opt_state, cut.state.opt_state)
    assert meta["step"] == 2 and meta["data"] == cut.state.position.as_dict()
    ckpt.close()
    resumed = Trainer(CFG, TC, stream, str(tmp_path / "cut"), identity={"test": 1}, log=lambda line: None)
    assert resumed.state.step == 2 and _equal(resumed.state.weights, cut.state.weights)
    resumed.run()
    assert resumed.state.step == TC.steps
    assert _equal(resumed.state.weights, whole.state.weights)
    assert _equal(resumed.state.opt_state, whole.state.opt_state)
    assert [h["loss"] for h in resumed.history] == losses[2:]
    with pytest.raises(ValueError, match="another run"):
        Trainer(CFG, TC, stream, str(tmp_path / "cut"), identity={"test": 2}, log=lambda line: None)

    # The export loads through the normal loader; its logits are the training module's.
    folder = tmp_path / "export"
    figures = make_evaluator(CFG)(whole.state.weights, windows(stream, TC.seq_len)[:6], TC.batch)
    assert figures["heldout_perplexity"] < 1024 and 0 <= figures["mtp_top1"] <= 1
    export(str(folder), whole.state.weights, CFG, CONFIG_JSON, str(tokenizer_dir), figures)
    config = json.loads((folder / "config.json").read_text())
    assert config["mtp_num_hidden_layers"] == 1 and config["dtype"] == "float32"
    model = load_model(str(folder))
    assert model.dtype_name == "float32" and model.config == CFG
    assert _equal(jax.tree.map(np.asarray, model.params), whole.state.weights["params"])
    assert _equal(mtp_params(model.mtp, CFG), whole.state.weights["mtp"])
    tokens = jnp.asarray(stream[:40])
    reference = jax.jit(lambda w, t: HybridLM(CFG, w["params"], w["mtp"])(t)[0])(whole.state.weights, tokens)
    assert np.array_equal(np.asarray(model.forward(tokens)), np.asarray(reference))
    assert json.loads((folder / "metrics.json").read_text())["mtp_top1"] == figures["mtp_top1"]
