"""`ninfer trace --report=DIR`: the figures as JSON, four plots that render, a summary linking them."""
from __future__ import annotations

import json

from ninfer_jax import EngineConfig
from ninfer_jax.bench import trace as T
from trace_helpers import marconi_line, write_lines

CFG = EngineConfig(max_concurrency=2, max_context=1024, chunk_size=128, progress=False)
PNG = b"\x89PNG\r\n\x1a\n"


def test_report_files_exist_and_the_plots_render(tmp_path):
    lines, system = [], list(range(100, 260))
    for s in range(3):
        prompt = system + [300 + s]
        for turn in range(3):
            lines.append(marconi_line(s, turn, turn + 0.1 * s, prompt, [400 + turn] * 4))
            prompt = prompt + [400 + turn] * 4 + [500 + 10 * s + turn] * 12
    path = write_lines(tmp_path / "t.jsonl", lines)
    out = tmp_path / "report"
    f = T.run_trace(path, CFG, program="sim", cold=True, report=str(out))
    for name in ("ttft_cdf.png", "reuse_by_turn.png", "occupancy.png", "pauses.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name  # a real rendered image
    saved = json.loads((out / "figures.json").read_text())
    assert saved["cached_tokens"] == f["cached_tokens"]
    rows = saved["reuse_by_turn"]
    assert [r["turn"] for r in rows] == [0, 1, 2] and all(r["requests"] == 3 for r in rows)
    assert sum(r["cached_tokens"] for r in rows) == f["cached_tokens"]
    assert rows[2]["cached_pct"] > rows[0]["cached_pct"]  # later turns extend cached history
    summary = (out / "summary.md").read_text()
    assert all(f"({n})" in summary for n in ("ttft_cdf.png", "occupancy.png", "figures.json"))
