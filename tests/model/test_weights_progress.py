"""Weight loading reports each safetensors shard (name, bytes, bytes so far / total, ETA), on
stderr only when progress is on."""
import json
import os
import shutil
import types

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ninfer_jax.config import EngineConfig
from ninfer_jax.model.model import load_model
from ninfer_jax.model import weights
from ninfer_jax.model.weights import ShardProgress
from ninfer_jax.program.program import Program
from oracle_paths import oracle_dir

SRC = "qwen3_next"
SHARDS = ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
          "model-00003-of-00003.safetensors")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The oracle checkpoint split over three shards with an index: the first two hold the
    model's tensors alternately (so leaves read from one shard pull tensors from the other),
    the third only a vision tensor, which is never read."""
    folder = tmp_path_factory.mktemp("sharded")
    shutil.copy(os.path.join(oracle_dir(SRC), "config.json"), folder / "config.json")
    tensors = load_file(os.path.join(oracle_dir(SRC), "model.safetensors"))
    names = sorted(tensors)
    parts = {SHARDS[0]: {n: tensors[n] for n in names[::2]}, SHARDS[1]: {n: tensors[n] for n in names[1::2]},
             SHARDS[2]: {"model.visual.patch_embed.weight": np.zeros((4, 4), np.float32)}}
    weight_map = {}
    for fname, part in parts.items():
        save_file(part, str(folder / fname))
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return str(folder)


def test_each_shard_is_reported_once_in_file_order(sharded, monkeypatch):
    # A fake clock (the loader's only), advancing 2 s per reading: elapsed and ETA are exact.
    ticks = iter(range(100, 1000, 2))
    monkeypatch.setattr(weights, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    reports: list[ShardProgress] = []
    model = load_model(sharded, progress=reports.append)
    sizes = [os.path.getsize(os.path.join(sharded, f)) for f in SHARDS]
    assert [r.name for r in reports] == list(SHARDS)
    assert [(r.done, r.count) for r in reports] == [(1, 3), (2, 3), (3, 3)]
    assert [r.shard_bytes for r in reports] == sizes
    assert [r.done_bytes for r in reports] == [sizes[0], sizes[0] + sizes[1], sum(sizes)]
    assert all(r.total_bytes == sum(sizes) for r in reports)
    assert [r.elapsed_s for r in reports] == [2.0, 4.0, 6.0]
    assert reports[0].eta_s == pytest.approx(2.0 * (sum(sizes) - sizes[0]) / sizes[0])
    assert reports[-1].eta_s == 0
    # Reading in file order changes nothing about what is loaded.
    fx = np.load(os.path.join(oracle_dir(SRC), "oracle.npz"))
    np.testing.assert_allclose(np.asarray(model.forward(fx["prompt"])), fx["prompt_logits"], atol=1e-4, rtol=0)


def test_line_format():
    line = ShardProgress(2, 5, "model-00002-of-00005.safetensors", int(4.9e9), int(3.9e9), int(9.8e9), 13.0).line()
    assert line == "[ninfer] weights 2/5 model-00002-of-00005.safetensors (4.9 GB) 3.9/9.8 GB, ETA 20 s"
    last = ShardProgress(1, 1, "model.safetensors", 193_500, 193_500, 193_500, 0.31).line()
    assert last == "[ninfer] weights 1/1 model.safetensors (193.5 kB) 193.5/193.5 kB, done in 0.3 s"


def test_program_prints_shards_on_stderr_only_with_progress(sharded, capsys):
    small = dict(model=sharded, max_concurrency=1, max_context=128)
    Program(EngineConfig(progress=True, **small))
    err = capsys.readouterr().err.splitlines()
    lines = [line for line in err if line.startswith("[ninfer] weights ")]
    assert [line.split()[2:4] for line in lines] == [["1/3", SHARDS[0]], ["2/3", SHARDS[1]], ["3/3", SHARDS[2]]]
    assert "ETA" in lines[0] and "done in" in lines[-1]
    Program(EngineConfig(progress=False, **small))
    captured = capsys.readouterr()
    assert "[ninfer]" not in captured.err and "[ninfer]" not in captured.out
