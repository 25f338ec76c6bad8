"""`ninfer plan`: the capacity plan from config.json alone (CFG-2, CFG-6), in process.

The `ninfer` fixture fails a test that builds an engine or a Program or loads a model; here the
checkpoint reader is refused too, and the fixture folder holds no weights at all.
"""
import json
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]
NEXT_80B = str(ROOT / "tests" / "fixtures" / "configs" / "qwen3_next_80b_a3b")
GIB = 1 << 30
PARAMS_80B = 79_674_391_296  # tests/engine/test_capacity_plan.py derives it from the geometry
STATE_IMAGE_80B = 36 * (3 * 8192 * 2 + 4 * 32 * 128 * 128) + 2048 * 2
PAGE_80B = 64 * 2 * 12 * 2 * 256 * 2


class WeightsRead(AssertionError):
    pass


@pytest.fixture
def plan(ninfer, monkeypatch):
    def refuse(*a, **k):
        raise WeightsRead("ninfer plan read a checkpoint's tensors")

    monkeypatch.setattr("ninfer_jax.model.weights.load_params", refuse)
    monkeypatch.setattr("ninfer_jax.model.weights.Tensors", refuse)
    return lambda *args: ninfer("plan", *args)


def _80b(*extra):
    return (f"--model={NEXT_80B}", "--max_concurrency=8", "--max_context=32768", *extra)


def test_plan_json_of_the_80b_config_on_a_192_gib_device(plan):
    code, out, err = plan(*_80b(f"--device_memory_bytes={192 * GIB}", "--json"))
    assert code == 0, err
    p = json.loads(out)
    assert p["dtype"] == "bfloat16" and p["itemsize"] == 2  # auto: config.json's torch_dtype
    assert p["budget"]["source"] == "device_memory_bytes" and p["budget"]["device_bytes"] == 192 * GIB
    assert p["budget"]["usable_bytes"] == 192 * GIB * 9 // 10
    assert p["weights"] == {"parameters": PARAMS_80B, "bytes": 2 * PARAMS_80B, "charged": True}
    assert p["main_kv"]["pages"] == 8 * 512 and p["main_kv"]["tokens"] == 8 * 32768
    assert p["main_kv"]["bytes"] == 4096 * PAGE_80B and p["main_kv"]["limited_by"] == "CFG-6 upper bound"
    assert p["state_slots"] == {"count": 16, "bytes_each": STATE_IMAGE_80B, "bytes": 16 * STATE_IMAGE_80B}
    assert p["backend_pools"] == {"pools": [], "bytes": 0}
    assert p["workspace"]["store_bytes"] == 512 * PAGE_80B + STATE_IMAGE_80B  # one request's context
    assert p["workspace"]["bytes"] == p["workspace"]["decode_bytes"] > p["workspace"]["store_bytes"]
    # prefill at page-table widths 2, 8, 32, 128 and 512 pages (the xla backend reads every page of
    # its table: plan/workspace.prefill_table_widths) + decode buckets 2, 4, 8
    assert p["compiled_steps"]["programs"] == 5 + 3
    used = (2 * PARAMS_80B + 4096 * PAGE_80B + 16 * STATE_IMAGE_80B + p["workspace"]["bytes"]
            + p["compiled_steps"]["bytes"])
    assert p["budget"]["free_bytes"] == p["budget"]["usable_bytes"] - used > 0
    assert p["host_arena_bytes"] == 8 * GIB + 8 * STATE_IMAGE_80B


def test_plan_text_names_every_part(plan):
    code, out, err = plan(*_80b(f"--device_memory_bytes={192 * GIB}"))
    assert code == 0 and err == ""
    labels = [line.split("  ")[0] for line in out.splitlines()[1:]]
    assert labels == ["device memory", "usable", "weights", "Main KV", "StateImage slots", "backend pools",
                      "workspace", "compiled steps", "free", "Host arena", "default split"]
    assert out.startswith(f"ninfer plan: {NEXT_80B} (qwen3_next), bfloat16, C=8, max_context=32768")
    assert f"{PARAMS_80B:,} parameters × 2 B" in out and "4,096 pages" in out and "262,144 tokens" in out


def test_plan_that_cannot_fit_exits_1_with_the_config_error(plan):
    code, out, err = plan(*_80b(f"--device_memory_bytes={141 * GIB}"))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ninfer plan: ConfigError: device_memory_bytes: the weights alone need "
                               f"{2 * PARAMS_80B:,} B (148.41 GiB")
    assert f"{141 * GIB * 9 // 10:,} B" in lines[0]
    # The Main KV's CFG-6 lower bound: same exit, the field named.
    code, _, err = plan(*_80b(f"--device_memory_bytes={150 * GIB}", "--device_memory_fraction=1"))
    assert code == 1 and err.startswith("ninfer plan: ConfigError: kv_capacity: device memory budget")


@pytest.mark.parametrize("args, line_start", [
    (("--max_concurrency=9",), "ninfer plan: ConfigError: max_concurrency: "),
    (("--device_memory_fraction=0",), "ninfer plan: ConfigError: device_memory_fraction: must be a number in (0, 1]"),
    (("--device_memory_fraction=1.5",), "ninfer plan: ConfigError: device_memory_fraction: "),
    (("--device_memory_bytes=0",), "ninfer plan: ConfigError: device_memory_bytes: must be a positive number"),
    (("--device_memory_bytes=lots",), "ninfer plan: IllegalFlagValueError: flag --device_memory_bytes=lots"),
    (("--model=/nonexistent/folder",), "ninfer plan: ConfigError: model: "),
    (("extra",), "ninfer plan: UsageError: unexpected argument 'extra'"),
])
def test_plan_bad_flags_exit_2(plan, args, line_start):
    code, out, err = plan(*args)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(line_start), err


def test_plan_dtype_flag_sizes_the_weights(plan):
    code, out, _ = plan(*_80b(f"--device_memory_bytes={400 * GIB}", "--dtype=float32", "--json"))
    assert code == 0
    p = json.loads(out)
    assert p["dtype"] == "float32" and p["weights"]["bytes"] == 4 * PARAMS_80B


def test_plan_without_device_memory_bytes_asks_the_device(plan, monkeypatch):
    # This machine's CPU keeps no memory statistics: the documented 1 GiB default for the pools.
    code, out, _ = plan("--json")
    assert code == 0
    p = json.loads(out)
    assert p["budget"]["source"] == "default" and p["budget"]["budget_bytes"] == GIB
    assert not p["budget"]["charged"] and p["main_kv"]["pages"] == 4 * 32  # the built-in model, C=4

    class Gpu:
        platform, device_kind = "gpu", "Fake 192 GiB"

        def memory_stats(self):
            return {"bytes_limit": 192 * GIB, "bytes_in_use": 0}

        def __str__(self):
            return "cuda:0"

    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [Gpu()])
    code, out, _ = plan(*_80b("--json"))
    assert code == 0
    p = json.loads(out)
    assert p["budget"]["source"] == "memory_stats" and p["budget"]["device"] == "cuda:0"
    assert p["budget"]["device_bytes"] == 192 * GIB and p["main_kv"]["pages"] == 4096


def test_plan_is_in_the_help(capsys):
    from ninfer_jax import cli

    for args in (["help", "plan"], ["plan", "--help"]):
        with pytest.raises(SystemExit) as done:
            cli.run(["ninfer", *args])
        out = capsys.readouterr().out
        assert done.value.code == 0 and out.startswith("usage: ninfer plan")
        for flag in ("--device_memory_bytes=BYTES", "--device_memory_fraction=FRACTION", "--[no]json",
                     "--max_concurrency=INT", "--model=FOLDER", "--dtype="):
            assert f"\n  {flag}" in out, flag
    with pytest.raises(SystemExit):
        cli.run(["ninfer", "--help"])
    assert "\n  plan " in capsys.readouterr().out


def _quarter_rule(max_context, c, n):
    """The documented default split, computed here: one StateImage per max_context/4 of Main KV;
    2C slots at least and at most what leaves Main KV one max_context, where N allows."""
    quarter_pages = -(-(-(-max_context // 4)) // 64)
    share = STATE_IMAGE_80B / (STATE_IMAGE_80B + quarter_pages * PAGE_80B)
    keep = 1 - max(c, -(-max_context // 64)) * PAGE_80B / n
    assert keep >= c * STATE_IMAGE_80B / n  # these tests' budgets hold C slots and one max_context
    return min(max(share, min(2 * c * STATE_IMAGE_80B / n, keep)), keep)


def test_plan_shows_the_default_split_in_text_and_json(plan):
    code, out, err = plan(*_80b(f"--device_memory_bytes={192 * GIB}", "--json"))
    assert code == 0, err
    p = json.loads(out)
    pools = 4096 * PAGE_80B + 16 * STATE_IMAGE_80B  # this plan's Main KV and StateImage slots
    split = p["split"]
    assert split["pool_bytes"] == pools and split["default"] == pytest.approx(_quarter_rule(32768, 8, pools))
    assert split["state_slots"] == int(split["default"] * pools / STATE_IMAGE_80B)
    assert split["kv_pages"] == min(4096, (pools - split["state_slots"] * STATE_IMAGE_80B) // PAGE_80B)
    assert "one StateImage per max_context/4 of Main KV" in split["rule"] and "cache" not in p
    code, text, _ = plan(*_80b(f"--device_memory_bytes={192 * GIB}"))
    row = text.splitlines()[-1]
    assert row.startswith("default split") and f"S = {split['default']:.4g}," in row
    assert f"{split['state_slots']:,} StateImage slots + {split['kv_pages']:,} Main KV pages" in row


def test_plan_with_cache_device_bytes_shows_the_split_pools(plan):
    n = 64 * GIB
    code, out, err = plan(f"--model={NEXT_80B}", "--max_concurrency=8", f"--device_memory_bytes={192 * GIB}",
                          f"--cache_device_bytes={n}", "--split=0.25", "--json")
    assert code == 0, err
    p = json.loads(out)
    cache = p["cache"]
    slots = int(0.25 * n / STATE_IMAGE_80B)
    pages = (n - slots * STATE_IMAGE_80B) // PAGE_80B
    assert (cache["split"], cache["split_source"], cache["state_slots"], cache["kv_pages"]) == (
        0.25, "--split", slots, pages)
    assert cache["state_bytes"] + cache["kv_bytes"] <= n and cache["unused_bytes"] == n - slots * STATE_IMAGE_80B \
        - pages * PAGE_80B
    # max_context not given: the default 2048 raised so that C contexts cover the pool (CFG-6).
    assert cache["max_context"] == 64 * -(-pages // 8)
    assert p["split"]["pool_bytes"] == n and p["split"]["default"] == pytest.approx(_quarter_rule(2048, 8, n))
    # Given --max_context is kept: Main KV stops at its CFG-6 upper bound and the rest is unused.
    code, out, _ = plan(*_80b(f"--device_memory_bytes={192 * GIB}", f"--cache_device_bytes={n}", "--split=0.25"))
    assert code == 0
    row = out.splitlines()[-1]
    assert row.startswith("cache bytes") and "4,096 Main KV pages" in row and "(--max_context)" in row


@pytest.mark.parametrize("args, line_start", [
    (("--cache_device_bytes=1073741824", "--split=1.5"), "ninfer plan: ConfigError: split: "),
    (("--split=0.25",), "ninfer plan: ConfigError: split: is the StateImage share of --cache_device_bytes"),
    (("--cache_device_bytes=0",), "ninfer plan: ConfigError: cache_device_bytes: must be a positive number"),
    ((f"--cache_device_bytes={STATE_IMAGE_80B}",), "ninfer plan: ConfigError: cache_device_bytes: "),
])
def test_plan_bad_cache_flags_exit_2(plan, args, line_start):
    code, out, err = plan(*_80b(f"--device_memory_bytes={192 * GIB}", *args))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(line_start), err
