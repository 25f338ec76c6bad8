"""`ninfer bench serve [--json]`: the gRPC service's overhead over the in-process engine.

The same load (closed loop: N requests, C in flight, fixed prompt and output lengths, greedy)
runs twice on one engine: through `engine.submit` in this process, then through the `ninfer.v1`
service over a loopback channel, driven by a separate client process (`server/loadgen.py`), as
a deployment would be. Reports requests/s and TTFT p50/p99 of both, and the ratios
served / in-process. With --same_process the client runs on threads of this process instead
(its Python work then competes with the engine for the GIL).

Flags after `serve` (after `--`): --requests N (64), --concurrency N (8), --prompt_len N (32),
--max_tokens N (16), --max_concurrency N (engine lanes, 4), --fake (the deterministic fake
engine instead of the built-in model), --same_process, --http (also through the OpenAI-compatible
HTTP API's `/v1/completions` with SSE, the client in its own process too: requests/s and TTFT
against the in-process engine and against gRPC, `http_vs_*_ratio`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ninfer_jax.bench import int_arg


def _say(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _figures(prefix: str, wall: float, ttfts: list[float], n: int) -> dict:
    from server.loadgen import percentile

    return {f"{prefix}_requests_per_s": n / wall, f"{prefix}_ttft_p50_ms": 1e3 * percentile(ttfts, 50),
            f"{prefix}_ttft_p99_ms": 1e3 * percentile(ttfts, 99)}


def _served_in_child(address: str, n: int, concurrency: int, prompt_len: int, max_tokens: int, vocab: int,
                     model: str | None = None) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: server/..
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    extra = [f"--model={model}"] if model else []
    out = subprocess.run([sys.executable, "-m", "server.loadgen", f"--target={address}", f"--requests={n}",
                          f"--concurrency={concurrency}", f"--prompt_len={prompt_len}", f"--max_tokens={max_tokens}",
                          f"--vocab={vocab}", *extra], capture_output=True, text=True, timeout=1800, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{out.stderr}")
    return json.loads(out.stdout)


def run(argv: list[str]) -> dict:
    from ninfer_jax.engine.types import SamplingParams
    from server import loadgen
    from server.fake_engine import FakeEngine, running_server

    n = int_arg(argv, "requests", 64)
    concurrency = int_arg(argv, "concurrency", 8)
    prompt_len = int_arg(argv, "prompt_len", 32)
    max_tokens = int_arg(argv, "max_tokens", 16)
    lanes = int_arg(argv, "max_concurrency", 4)
    fake = "--fake" in argv
    same_process = "--same_process" in argv
    http = "--http" in argv
    max_context = max(256, prompt_len + max_tokens + 1)

    if fake:
        engine = FakeEngine(max_concurrency=lanes, max_context=max_context, min_len=max_tokens, max_len=max_tokens)
    else:
        from ninfer_jax import Engine, EngineConfig

        _say(f"building the engine (builtin:tiny-hybrid, C={lanes}, max_context={max_context})")
        engine = Engine(EngineConfig(max_concurrency=lanes, max_context=max_context, chunk_size=32))
    vocab = min(engine.model_info()["vocab_size"], 1000)
    prompts = loadgen.make_prompts(n, prompt_len, vocab)
    sampling = SamplingParams(**loadgen.sampling(max_tokens))

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
        out = _figures("inprocess", *loadgen.drive(in_process, n, concurrency), n)
        kwargs = {"http_port": 0} if http else {}
        with running_server(engine, progress=_say, **kwargs) as (srv, _):
            _say(f"served over {srv.address} from {'this' if same_process else 'a client'} process: the same load")
            if same_process:
                served = loadgen.served_load(srv.address, prompts, max_tokens, concurrency)
            else:
                served = _served_in_child(srv.address, n, concurrency, prompt_len, max_tokens, vocab)
            out.update(_figures("served", served["wall_s"], served["ttft_s"], n))
            if http:
                url, model = f"http://{srv.http.address}", engine.model_info()["name"]
                _say(f"over HTTP at {url} (/v1/completions, SSE): the same load")
                if same_process:
                    got = loadgen.http_load(url, prompts, max_tokens, concurrency, model)
                else:
                    got = _served_in_child(url, n, concurrency, prompt_len, max_tokens, vocab, model)
                out.update(_figures("http", got["wall_s"], got["ttft_s"], n))
        engine.check_integrity()
    finally:
        engine.close()
    out["requests_per_s_ratio"] = out["served_requests_per_s"] / out["inprocess_requests_per_s"]
    out["ttft_p50_ratio"] = out["served_ttft_p50_ms"] / out["inprocess_ttft_p50_ms"]
    out["ttft_p99_ratio"] = out["served_ttft_p99_ms"] / out["inprocess_ttft_p99_ms"]
    if http:  # HTTP against the in-process engine and against gRPC, side by side in this run
        for base, name in (("inprocess", "inprocess"), ("served", "grpc")):
            out[f"http_vs_{name}_requests_per_s_ratio"] = out["http_requests_per_s"] / out[f"{base}_requests_per_s"]
            out[f"http_vs_{name}_ttft_p50_ratio"] = out["http_ttft_p50_ms"] / out[f"{base}_ttft_p50_ms"]
            out[f"http_vs_{name}_ttft_p99_ratio"] = out["http_ttft_p99_ms"] / out[f"{base}_ttft_p99_ms"]
    out.update(requests=n, concurrency=concurrency, prompt_len=prompt_len, max_tokens=max_tokens,
               max_concurrency=lanes, client="same process" if same_process else "separate process",
               engine="fake" if fake else "builtin:tiny-hybrid")
    return out
