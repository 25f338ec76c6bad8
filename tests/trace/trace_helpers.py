"""Shared bits of the trace tests: whether the engine's reuse wiring is present, and a tiny
hand-made Marconi trace."""
import dataclasses
import json

import pytest

from ninfer_jax import ContextCacheConfig

# The context-reuse wiring brings ContextCacheConfig(enabled=...); before it, cached_tokens is 0.
REUSE_WIRED = "enabled" in {f.name for f in dataclasses.fields(ContextCacheConfig)}
needs_reuse = pytest.mark.xfail(not REUSE_WIRED, strict=False, reason="engine reuse wiring not landed")


def marconi_line(session, turn, ts, prompt, output, **over) -> str:
    obj = {"session_id": session, "turn_id": turn, "ts": ts, "num_input_tokens": len(prompt),
           "num_output_tokens": len(output), "input_tokens": list(prompt), "output_tokens": list(output)}
    obj.update(over)
    return json.dumps(obj)


def write_lines(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)
