"""scripts/device_check.py only runs where a GPU is lent: keep its CPU smoke mode working (the
kernel section in interpret mode and the model section on a tiny random model), and check the
bandwidth bookkeeping it reports."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.py"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("pk_device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_check_tiny_runs_kernels_and_model(mod, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    out_file = tmp_path / "dc.json"
    rc = mod.main(["--backend", "interpret", "--tiny", "--reps", "1", "--only", "gather,causal_conv1d_update",
                   "--out", str(out_file)])
    out = capsys.readouterr().out
    assert rc == 0, out
    last = json.loads(out.strip().splitlines()[-1])
    assert last["ok"] and last["kernels_ok"] and last["models_ok"]
    assert [r["kernel"] for r in last["results"]] == ["causal_conv1d_update", "gather"]
    for r in last["results"]:
        assert r["bytes"] > 0 and r["gbs_interpret"] > 0 and r["gbs_xla"] > 0
        assert r["peak_frac_interpret"] is None  # a CPU has no entry in the peak table
    assert last["peak_bytes_per_s"] is None and "peak_note" in last
    (model,) = last["models"]
    assert model["model"] == "tiny" and model["backend"] == "xla" and "error" not in model
    assert model["prefill"]["tokens_per_s"] > 0
    assert model["decode"]["c1"]["bucket"] == 2 and model["decode"]["c1"]["padding_rows"] == 1
    assert model["decode"]["c8"]["bucket"] == 8 and model["decode"]["c8"]["tokens_per_s"] > 0
    assert sorted(c["kind"] for c in model["compilations"]) == ["decode", "decode", "prefill"]
    # The file, and its copy under $OUT, hold the same record.
    assert json.loads(out_file.read_text()) == last
    assert json.loads((tmp_path / "out" / "dc.json").read_text()) == last


def test_peak_bandwidth_table(mod):
    assert mod.peak_bandwidth("NVIDIA H100 80GB HBM3", None)["bytes_per_s"] == 3.35e12
    assert mod.peak_bandwidth("NVIDIA H100 PCIe", None)["bytes_per_s"] == 2.0e12
    assert mod.peak_bandwidth("NVIDIA H200", None)["bytes_per_s"] == 4.8e12
    unknown = mod.peak_bandwidth("NVIDIA A100-SXM4-80GB", None)
    assert unknown["bytes_per_s"] is None and "--peak_gbs" in unknown["note"]
    assert mod.peak_bandwidth("cpu", 1000.0) == {"bytes_per_s": 1e12, "source": "--peak_gbs"}


def test_moved_bytes_counts_the_pages_read(mod):
    ps, hkv, d = 16, 2, 32
    pool = np.zeros((9, ps, hkv, d), np.float32)
    page = ps * hkv * d * 4
    q = np.zeros((3, 4, d), np.float32)  # 3 rows, 4 query heads
    table = np.zeros((3, 4), np.int32)
    ctx = np.array([33, 0, 16], np.int32)  # 3 pages, none, 1 page
    got = mod.moved_bytes("decode_attention", (q, pool, pool, table, ctx), q, ps)
    assert got == 2 * q.nbytes + table.nbytes + ctx.nbytes + 2 * 4 * page  # K and V of 4 pages
    idx = np.array([3, -1, 5], np.int32)
    assert mod.moved_bytes("scatter", (pool, idx, pool[:3]), pool, ps) == 2 * 2 * page + idx.nbytes
    dense = np.zeros((2, 8), np.float32)
    assert mod.moved_bytes("causal_conv1d_update", (dense, dense), (dense,), ps) == 3 * dense.nbytes
