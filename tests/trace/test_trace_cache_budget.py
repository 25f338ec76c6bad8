"""`ninfer trace --program=sim --cache_device_bytes=N [--split=S | --split_sweep=...] [--skip_too_long]`:
one byte budget shared by the StateImage slots and the Main KV pages instead of the device solve,
the max_context that goes with the pool (CFG-6), a sweep of splits with its best, and requests
too long for the pool reported one by one. Sizes are checked against the geometry's config.json
read here, not through the engine's code."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ninfer_jax import ContextCacheConfig, EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.errors import ConfigError
from trace_helpers import marconi_line, run_cli, write_lines

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = ROOT / "ninfer_jax" / "sim" / "geometries" / "qwen3_next_80b_a3b"
GIB = 1 << 30


def _sizes():
    """(Main KV page bytes, StateImage bytes) of the shipped geometry in bfloat16, from its JSON."""
    c = json.loads((GEOMETRY / "config.json").read_text())
    attention = c["num_hidden_layers"] // c["full_attention_interval"]
    linear = c["num_hidden_layers"] - attention
    page = 64 * 2 * attention * c["num_key_value_heads"] * c["head_dim"] * 2
    conv = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
            + c["linear_num_value_heads"] * c["linear_value_head_dim"])
    recurrent = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"] * 4
    state = linear * ((c["linear_conv_kernel_dim"] - 1) * conv * 2 + recurrent) + c["hidden_size"] * 2
    return page, state


PAGE, SLOT = _sizes()


def _config(**kw):
    base = dict(model=str(GEOMETRY), max_concurrency=2, chunk_size=256, progress=False,
                context_cache=ContextCacheConfig(host_capacity_bytes=4 * GIB))
    base.update(kw)
    return EngineConfig(**base)


def _ids(start, n):
    return [150_000 + (start + i) % 1500 for i in range(n)]  # ids only a Qwen-sized vocabulary has


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """Two sessions of two turns over a shared 200-token prefix; turn 2 extends turn 1's prompt
    and output. The longest request: 200 + 40 + 4 + 30 + 4 = 278 tokens."""
    lines = []
    for s in range(2):
        prompt = _ids(0, 200) + _ids(300 + 100 * s, 40)
        lines.append(marconi_line(s, 0, 0.1 * s, prompt, [7] * 4))
        lines.append(marconi_line(s, 1, 1 + 0.1 * s, prompt + [7] * 4 + _ids(900 + 50 * s, 30), [8] * 4))
    return write_lines(tmp_path_factory.mktemp("budget") / "small.jsonl", lines)


def _expected_pools(n, split, c=2):
    slots = int(split * n / SLOT)
    pages = (n - slots * SLOT) // PAGE
    return slots, pages


def test_two_splits_of_one_budget_give_different_pools_within_it(small_trace):
    n = 2 * GIB
    got = {}
    for split in (0.2, 0.6):
        f = T.run_trace(small_trace, _config(), program="sim", cold=False, cache_device_bytes=n, split=split)
        slots, pages = _expected_pools(n, split)
        pools, budget = f["pools"], f["cache_budget"]
        # The ledger's pools are the split's, at the geometry's real unit sizes.
        assert (pools["state_slots"]["units"], pools["main_kv"]["units"]) == (slots, pages)
        assert (pools["state_slots"]["unit_bytes"], pools["main_kv"]["unit_bytes"]) == (SLOT, PAGE)
        used = pools["state_slots"]["bytes"] + pools["main_kv"]["bytes"]
        assert used == budget["state_bytes"] + budget["kv_bytes"] <= n
        assert n - used < PAGE  # what is left over is less than one more page
        assert budget["unused_bytes"] == n - used and f["split"] == split == budget["split"]
        # max_context: the trace's longest request, raised until C full contexts cover the pool (CFG-6).
        assert budget["longest_request"] == 278
        mc = f["max_context"]
        assert mc == max(278, 64 * math.ceil(pages / 2))
        assert max(math.ceil(mc / 64), 2) <= pages <= 2 * math.ceil(mc / 64)
        assert f["requests_failed"] == 0 and f["requests_too_long"] == 0 and f["too_long_requests"] == []
        got[split] = (slots, pages, f["cached_tokens"])
    assert got[0.2][0] < got[0.6][0] and got[0.2][1] > got[0.6][1]
    assert all(c >= 240 for _, _, c in got.values())  # turn 2 reuses at least turn 1's prompt


def test_the_default_split_is_the_documented_rule(small_trace):
    from ninfer_jax.model.config import load_config
    from ninfer_jax.plan import default_split

    n = 2 * GIB
    f = T.run_trace(small_trace, _config(), program="sim", cold=False, cache_device_bytes=n)
    # One StateImage per max_context/4 of Main KV (max_context: the longest request, 278 tokens):
    # 2 GiB holds 2C slots and one max_context either way, so the quarter rule alone decides.
    quarter_pages = math.ceil(math.ceil(278 / 4) / 64)
    rule = SLOT / (SLOT + quarter_pages * PAGE)
    b = f["cache_budget"]
    assert b["split_source"] == "default rule" and b["split"] == pytest.approx(rule)
    assert b["state_slots"] == int(rule * n / SLOT) >= 4 and b["kv_pages"] >= math.ceil(278 / 64)
    model = load_config(str(GEOMETRY))
    # Raised to 2C slots where the quarter rule gives fewer and Main KV still keeps one max_context
    # (C = 4: 8 slots and 1,024 pages of 65,536 tokens fit in 8 slots + 1,536 pages).
    n = 8 * SLOT + 1536 * PAGE
    assert SLOT / (SLOT + 256 * PAGE) < 8 * SLOT / n
    assert default_split(model, 2, 65536, 4, n) == pytest.approx(8 * SLOT / n)
    # Lowered below the quarter rule to keep one max_context of Main KV (27 pages for 1,669
    # tokens), 2C slots or not.
    n = 2 * SLOT + 30 * PAGE
    s = default_split(model, 2, 1669, 2, n)
    assert s == pytest.approx(1 - 27 * PAGE / n) and s < SLOT / (SLOT + 7 * PAGE) and s > 2 * SLOT / n
    assert int(s * n / SLOT) == 2 and (n - 2 * SLOT) // PAGE >= 27
    # C slots exactly when even those leave less than one max_context.
    n = 2 * SLOT + 10 * PAGE
    assert default_split(model, 2, 1669, 2, n) == pytest.approx(2 * SLOT / n)


def test_a_split_sweep_reports_every_split_and_the_best(small_trace):
    n = 2 * GIB
    sweep = T.run_trace(small_trace, _config(), program="sim", cold=True, cache_device_bytes=n,
                        split_sweep="0.2,0.6")
    single = T.run_trace(small_trace, _config(), program="sim", cold=True, cache_device_bytes=n, split=0.6)
    assert [e["split"] for e in sweep["sweep"]] == [0.2, 0.6]
    for entry in sweep["sweep"]:
        assert set(single) <= set(entry)  # every figure of a single run, for each split
        assert entry["cache_budget"]["split_source"] == "--split_sweep"
        assert entry["outputs_identical"] is True
    # The same budget and split replayed alone gives the same counters as its sweep entry.
    entry = sweep["sweep"][1]
    for key in ("cached_tokens", "prefill_tokens", "h2d_bytes", "pools", "max_context", "cold_prefill_tokens"):
        assert entry[key] == single[key], key
    best = max(sweep["sweep"], key=lambda e: (e["cached_tokens"], -e["ttft_mean_s"], -e["split"]))
    assert sweep["best_split"] == best["split"] and sweep["best_by"] == "cached_tokens"
    assert sweep["cache_device_bytes"] == n and sweep["requests"] == 4
    text = T.sweep_text(sweep)
    assert text.splitlines()[0].split()[:3] == ["split", "state_slots", "kv_pages"]
    assert f"best_split {sweep['best_split']:.4g} (by cached_tokens)" in text


def test_best_of_sweep_ties_go_to_fewer_too_long_then_lower_ttft():
    rows = [{"split": 0.1, "cached_tokens": 50, "requests_too_long": 0, "ttft_mean_s": 0.2},
            {"split": 0.3, "cached_tokens": 90, "requests_too_long": 2, "ttft_mean_s": 0.1},
            {"split": 0.5, "cached_tokens": 90, "requests_too_long": 1, "ttft_mean_s": 0.3},
            {"split": 0.7, "cached_tokens": 90, "requests_too_long": 1, "ttft_mean_s": 0.2}]
    assert T.best_of_sweep(rows)["split"] == 0.7
    rows[0]["cached_tokens"] = 91
    assert T.best_of_sweep(rows)["split"] == 0.1


# ---- requests too long for the pool ---------------------------------------------------------------
def _too_long_trace(tmp_path):
    """Requests needing (prompt + output) 304, 904, 404, 704 and exactly 640 tokens."""
    lines = [marconi_line(0, 0, 0.0, _ids(0, 300), [5] * 4),
             marconi_line(0, 1, 1.0, _ids(0, 900), [5] * 4),
             marconi_line(0, 2, 2.0, _ids(0, 400), [5] * 4),
             marconi_line(1, 0, 0.5, _ids(50, 700), [6] * 4),
             marconi_line(2, 0, 0.7, _ids(70, 636), [6] * 4)]
    return write_lines(tmp_path / "long.jsonl", lines)


def _ten_pages():
    """A budget whose split gives C = 1 two StateImage slots and exactly ten Main KV pages (640 tokens)."""
    n = 2 * SLOT + 10 * PAGE + 1000
    return n, (2 * SLOT + 100) / n


def test_skip_too_long_reports_the_exact_requests_and_replays_the_rest(tmp_path):
    path = _too_long_trace(tmp_path)
    n, split = _ten_pages()
    cfg = _config(max_concurrency=1)
    with pytest.raises(ConfigError, match=r"^cache_device_bytes: .*640 tokens, below the longest request "
                                          r"\(904 tokens\).*--skip_too_long"):
        T.run_trace(path, cfg, program="sim", cache_device_bytes=n, split=split)
    report = tmp_path / "report"
    f = T.run_trace(path, cfg, program="sim", cold=True, cache_device_bytes=n, split=split, skip_too_long=True,
                    report=str(report))
    assert f["pools"]["main_kv"]["units"] == 10 and f["pools"]["state_slots"]["units"] == 2
    assert f["max_context"] == 640 and "bounded by the pool" in f["cache_budget"]["max_context_source"]
    assert f["requests"] == 5 and f["requests_too_long"] == 2
    assert f["too_long_requests"] == [{"index": 1, "session": "0", "turn": 1, "tokens": 904},
                                      {"index": 3, "session": "1", "turn": 0, "tokens": 704}]
    # The rest replays whole: the 640-token request fits exactly, nothing fails.
    assert f["requests_failed"] == 0 and f["prompt_tokens"] == 300 + 400 + 636
    assert f["generated_tokens"] == 3 * 4 and f["cold_prefill_tokens"] == 300 + 400 + 636
    assert f["outputs_identical"] is True
    # The report shows the byte sizes, the split and the requests left out.
    summary = (report / "summary.md").read_text()
    assert "## Cache byte budget" in summary and f"S = {split:.4g} (--split)" in summary
    assert f"| StateImage slots (1 basic) | 2 | {SLOT:,} B" in summary
    assert f"| Main KV pages (640 tokens; cache bytes) | 10 | {PAGE:,} B" in summary
    assert "| 1 | 0 | 1 | 904 |" in summary and "| 3 | 1 | 0 | 704 |" in summary
    saved = json.loads((report / "figures.json").read_text())
    assert saved["too_long_requests"] == f["too_long_requests"] and saved["cache_budget"] == f["cache_budget"]


def test_skip_too_long_without_a_byte_budget_uses_max_context(tmp_path):
    path = _too_long_trace(tmp_path)
    cfg = _config(max_concurrency=1, max_context=704, device_memory_bytes=192 * GIB)
    f = T.run_trace(path, cfg, program="sim", cold=False, skip_too_long=True)
    assert [r["index"] for r in f["too_long_requests"]] == [1]  # 904 > 704; 704 fits exactly
    assert f["requests_failed"] == 0 and f["prompt_tokens"] == 300 + 400 + 700 + 636
    # Without the flag the too-long prompt is refused at submission as before, one failure.
    f = T.run_trace(path, cfg, program="sim", cold=False)
    assert f["requests_too_long"] == 0 and f["requests_failed"] == 1


def test_skip_too_long_on_a_chat_trace_counts_prompts_the_frontend_refuses(tmp_path):
    long_text = " ".join(["word"] * 400)
    lines = [json.dumps({"session": "a", "turn": 0, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
                         "reply": "Hello."}),
             json.dumps({"session": "a", "turn": 1, "max_tokens": 4,
                         "messages": [{"role": "user", "content": long_text}], "reply": "Long."}),
             json.dumps({"session": "b", "turn": 0, "max_tokens": 4, "messages": [{"role": "user", "content": "Yo"}]})]
    path = write_lines(tmp_path / "chat.jsonl", lines)
    cfg = EngineConfig(max_concurrency=2, max_context=256, chunk_size=64, progress=False)
    f = T.run_trace(path, cfg, program="sim", cold=False, skip_too_long=True)
    assert f["requests_too_long"] == 1 and f["requests_failed"] == 0
    (row,) = f["too_long_requests"]
    assert (row["index"], row["session"], row["turn"]) == (1, "a", 1) and row["tokens"] > 255
    assert T.run_trace(path, cfg, program="sim", cold=False)["requests_failed"] == 1


# ---- bad flags refuse clearly, before any work ------------------------------------------------------
@pytest.mark.parametrize("kw, field", [
    (dict(cache_device_bytes=GIB, split=1.5), "split"),
    (dict(cache_device_bytes=GIB, split=0.0), "split"),
    (dict(split=0.3), "split"),
    (dict(split_sweep="0.1,0.5"), "split_sweep"),
    (dict(cache_device_bytes=GIB, split_sweep="0.1,abc"), "split_sweep"),
    (dict(cache_device_bytes=GIB, split_sweep="0.2,0.2"), "split_sweep"),
    (dict(cache_device_bytes=GIB, split_sweep="0.2,1"), "split_sweep"),
    (dict(cache_device_bytes=GIB, split=0.3, split_sweep="0.2"), "split_sweep"),
    (dict(cache_device_bytes=0), "cache_device_bytes"),
    (dict(cache_device_bytes=GIB, program="model"), "cache_device_bytes"),
    (dict(cache_device_bytes=SLOT), "cache_device_bytes"),  # not even C = 2 basic StateImage slots
    (dict(cache_device_bytes=GIB, split=0.1), "split"),  # 1 GiB × 0.1 holds one StateImage, C = 2
    (dict(cache_device_bytes=4 * SLOT + PAGE + 10, split=0.999), "split"),  # leaves Main KV one page, C = 2
    (dict(cache_device_bytes=GIB, config=dict(kv_capacity=4096)), "kv_capacity"),
    (dict(cache_device_bytes=GIB, config=dict(device_memory_bytes=192 * GIB)), "device_memory_bytes"),
])
def test_bad_budget_flags_are_config_errors_naming_the_flag_before_any_replay(small_trace, monkeypatch, kw, field):
    def no_replay(*a, **k):
        raise AssertionError("a replay started")

    monkeypatch.setattr(T, "replay_once", no_replay)
    kw = dict(kw)
    cfg = _config(**kw.pop("config", {}))
    with pytest.raises(ConfigError) as e:
        T.run_trace(small_trace, cfg, **{"program": "sim", **kw})
    assert e.value.field == field, e.value


@pytest.mark.parametrize("args, line_start", [
    (("--program=sim", "--cache_device_bytes=1073741824", "--split=1.5"), "ConfigError: split: "),
    (("--program=sim", "--split_sweep=0.1,0.5"), "ConfigError: split_sweep: "),
    (("--program=model", "--cache_device_bytes=1073741824"), "ConfigError: cache_device_bytes: "),
    (("--program=sim", f"--cache_device_bytes={SLOT}"), "ConfigError: cache_device_bytes: "),
    (("--program=sim", "--cache_device_bytes=1073741824", "--max_concurrency=1", "--max_context=65536"),
     "ConfigError: cache_device_bytes: "),  # the pool holds less than one max_context (CFG-6)
])
def test_ninfer_trace_refuses_bad_budget_flags_in_one_line(small_trace, capsys, monkeypatch, args, line_start):
    def no_run(*a, **k):
        raise AssertionError("the replay started")

    monkeypatch.setattr(T, "run_trace", no_run)
    code, out, err = run_cli(capsys, "trace", small_trace, f"--model={GEOMETRY}", *args)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"ninfer trace: {line_start}"), err


def test_ninfer_trace_split_sweep_json(small_trace, capsys):
    code, out, err = run_cli(capsys, "trace", small_trace, "--program=sim", f"--model={GEOMETRY}", "--json",
                          "--max_concurrency=2", "--chunk_size=256", "--cold=false",
                          f"--cache_device_bytes={2 * GIB}", "--split_sweep=0.2,default")
    assert code == 0, err
    f = json.loads(out)
    assert set(f) >= {"sweep", "best_split", "best_by", "cache_device_bytes"}
    splits = [e["split"] for e in f["sweep"]]
    assert splits[0] == 0.2 and f["sweep"][1]["cache_budget"]["split_source"] == "default rule"
    assert f["best_split"] in splits and f["best_by"] == "cached_tokens"
    for e in f["sweep"]:
        assert e["pools"]["state_slots"]["bytes"] + e["pools"]["main_kv"]["bytes"] <= 2 * GIB
        assert {"cached_tokens", "reuse_pct", "ttft_mean_s", "requests_too_long", "max_context"} <= set(e)
    assert "[trace] split 0.2: S=0.2 (--split_sweep)" in err


def test_a_sweep_report_compares_the_splits(small_trace, tmp_path):
    report = tmp_path / "sweep"
    f = T.run_trace(small_trace, _config(), program="sim", cold=False, cache_device_bytes=2 * GIB,
                    split_sweep="0.2,0.6", report=str(report))
    saved = json.loads((report / "sweep.json").read_text())
    assert saved["best_split"] == f["best_split"] and len(saved["sweep"]) == 2
    summary = (report / "summary.md").read_text()
    for s in ("0.2", "0.6"):
        assert (report / f"split_{s}" / "summary.md").exists() and f"[split_{s}](split_{s}/summary.md)" in summary
    assert f"Best split: **{f['best_split']:.4g}**" in summary


def test_failed_requests_are_said_on_stderr_with_the_first_error(small_trace, capsys):
    """A replay sized below its trace still reports its figures, and says on stderr how many
    requests failed and why, instead of leaving it to `requests_failed` in the JSON."""
    code, out, err = run_cli(capsys, "trace", small_trace, "--program=sim", f"--model={GEOMETRY}", "--json",
                             "--max_concurrency=2", "--chunk_size=128", "--cold=false", "--max_context=256")
    assert code == 0, err
    f = json.loads(out)
    assert f["requests_failed"] == 2  # the two second turns: 274-token prompts (file lines 2 and 4)
    line = [l for l in err.splitlines() if "requests failed" in l]
    assert line == [f"[trace] 2 of 4 requests failed; the first (request 1): RequestError: prompt: 274 tokens "
                    f"exceed max_context=256 (--cache_device_bytes, --max_context or --skip_too_long size the "
                    f"replay for the trace)"], err
