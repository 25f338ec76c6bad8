"""`ninfer bench serve [--json]`: the gRPC service's overhead over the in-process engine.

The same load runs twice on one engine: through `engine.submit` directly, then through the
`ninfer.v1` service over a loopback channel (server and client threads in this process, so the
client's Python work counts against the service). Reports requests/s and TTFT p50/p99 of both,
and the ratios served / in-process.

Flags after `serve`: --requests N (64), --concurrency N (requests in flight, 8),
--prompt_len N (32), --max_tokens N (16), --max_concurrency N (engine lanes, 4),
--fake (the deterministic fake engine instead of the built-in model).
"""
from __future__ import annotations

import random
import sys
import threading
import time
from typing import Callable


def _arg(argv: list[str], name: str, default: int) -> int:
    for i, a in enumerate(argv):
        if a.startswith(f"--{name}="):
            return int(a.split("=", 1)[1])
        if a == f"--{name}" and i + 1 < len(argv):
            return int(argv[i + 1])
    return default


def _say(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _drive(one: Callable[[int], float], n: int, concurrency: int) -> tuple[float, list[float]]:
    """Run requests 0..n-1 with `concurrency` in flight; (wall seconds, TTFT seconds each)."""
    ttfts: list[float] = [0.0] * n
    next_index = iter(range(n))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            ttfts[i] = one(i)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, ttfts


def _figures(prefix: str, wall: float, ttfts: list[float], n: int) -> dict:
    return {f"{prefix}_requests_per_s": n / wall, f"{prefix}_ttft_p50_ms": 1e3 * _percentile(ttfts, 50),
            f"{prefix}_ttft_p99_ms": 1e3 * _percentile(ttfts, 99)}


def run(argv: list[str]) -> dict:
    from ninfer_jax.engine.types import SamplingParams
    from server.client import sampling_to_proto  # noqa: F401 - fail early without the server package
    from server.testing import FakeEngine, running_server

    n = _arg(argv, "requests", 64)
    concurrency = _arg(argv, "concurrency", 8)
    prompt_len = _arg(argv, "prompt_len", 32)
    max_tokens = _arg(argv, "max_tokens", 16)
    lanes = _arg(argv, "max_concurrency", 4)
    fake = "--fake" in argv
    max_context = max(256, prompt_len + max_tokens + 1)

    if fake:
        engine = FakeEngine(max_concurrency=lanes, max_context=max_context, min_len=max_tokens, max_len=max_tokens)
    else:
        from ninfer_jax import Engine, EngineConfig

        _say(f"building the engine (builtin:tiny-hybrid, C={lanes}, max_context={max_context})")
        engine = Engine(EngineConfig(max_concurrency=lanes, max_context=max_context, chunk_size=32))
    rng = random.Random(0)
    vocab = engine.model_info()["vocab_size"]
    prompts = [[rng.randrange(1, min(vocab, 1000)) for _ in range(prompt_len)] for _ in range(n)]
    params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
    sampling = SamplingParams(**params)

    def in_process(i: int) -> float:
        start = time.perf_counter()
        handle = engine.submit(prompts[i], sampling)
        first = None
        for _ in handle.stream():
            if first is None:
                first = time.perf_counter() - start
        handle.result()
        return first or 0.0

    try:
        for i in range(min(n, 2 * lanes)):  # warm the paths the load uses
            engine.generate(prompts[i], sampling)
        _say(f"in-process: {n} requests, {concurrency} in flight, {prompt_len}+{max_tokens} tokens")
        wall, ttfts = _drive(in_process, n, concurrency)
        out = _figures("inprocess", wall, ttfts, n)
        with running_server(engine, progress=_say) as (srv, client):

            def served(i: int) -> float:
                start = time.perf_counter()
                first = None
                for msg in client.generate_stream(prompts[i], sampling=params):
                    if msg.token_ids and first is None:
                        first = time.perf_counter() - start
                return first or 0.0

            served(0)
            _say(f"served over {srv.address}: the same load")
            wall, ttfts = _drive(served, n, concurrency)
            out.update(_figures("served", wall, ttfts, n))
        engine.check_integrity()
    finally:
        engine.close()
    out["requests_per_s_ratio"] = out["served_requests_per_s"] / out["inprocess_requests_per_s"]
    out["ttft_p50_ratio"] = out["served_ttft_p50_ms"] / out["inprocess_ttft_p50_ms"]
    out["ttft_p99_ratio"] = out["served_ttft_p99_ms"] / out["inprocess_ttft_p99_ms"]
    out.update(requests=n, concurrency=concurrency, prompt_len=prompt_len, max_tokens=max_tokens,
               max_concurrency=lanes, engine="fake" if fake else "builtin:tiny-hybrid")
    return out
