"""In-process `ninfer`: parse the flags as the command does, run `cli.main`, capture the streams.

The fixture fails the test if anything builds an engine, a Program or loads a model (or, with
`--server`, connects): the inputs these tests give must be refused before that.
"""
import json

import numpy as np
import pytest
from absl import flags

from cli_runner import run_cli


class ModelLoaded(AssertionError):
    pass


def _no_model(*args, **kwargs):
    raise ModelLoaded("the CLI built an engine / loaded the model for input preflight must refuse")


@pytest.fixture
def ninfer(monkeypatch, capsys):
    """`ninfer(*args) -> (exit status, stdout, stderr)`, run in process with no model allowed."""
    monkeypatch.setattr("ninfer_jax.engine.engine.Engine.__init__", _no_model)
    monkeypatch.setattr("ninfer_jax.program.program.Program.__init__", _no_model)
    monkeypatch.setattr("ninfer_jax.program.program.load_model", _no_model)
    monkeypatch.setattr("ninfer_jax.model.model.load_model", _no_model)
    monkeypatch.setattr("server.cli_commands.generate_remote", _no_model)
    monkeypatch.setattr("server.cli_commands.chat_remote", _no_model)
    monkeypatch.setattr("server.cli_commands.serve", _no_model)
    monkeypatch.setattr("ninfer_jax.bench.trace.run_trace", _no_model)

    def run(*args: str):
        return run_cli(capsys, *args)

    yield run
    flags.FLAGS.unparse_flags()


def _write_checkpoint(folder, *, weights=True):
    """A folder with the built-in model's config.json, and optionally a (tiny, wrong) safetensors
    file, no tokenizer.json: enough for everything read before the weights load."""
    from safetensors.numpy import save_file

    from ninfer_jax.model import builtin

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(builtin.HF_CONFIG))
    if weights:
        save_file({"model.embed_tokens.weight": np.zeros((4, 4), np.float32)}, str(folder / "model.safetensors"))
    return str(folder)


@pytest.fixture
def checkpoint(tmp_path):
    """`checkpoint(name, weights=True) -> folder` under tmp_path (see _write_checkpoint)."""
    return lambda name, **kw: _write_checkpoint(tmp_path / name, **kw)
