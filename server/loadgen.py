"""A closed-loop load generator for the service (used by `ninfer bench serve`).

`python -m server.loadgen --target HOST:PORT --requests 64 --concurrency 8 --prompt_len 32
--max_tokens 16 --vocab 1000` runs the load from its own process (imports no JAX) and prints one
JSON object: wall seconds and each request's time to first token. A target `http://HOST:PORT`
(with `--model NAME`) drives the OpenAI-compatible API's `/v1/completions` instead. `make_prompts` and `drive` are
shared with the in-process side of the benchmark so both run exactly the same load.
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time
from typing import Callable


def make_prompts(n: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(n)]


def sampling(max_tokens: int) -> dict:
    """Greedy, fixed length: every request produces exactly max_tokens tokens."""
    return {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}


def drive(one: Callable[[int], float], n: int, concurrency: int) -> tuple[float, list[float]]:
    """Run requests 0..n-1 with `concurrency` in flight; (wall seconds, TTFT seconds of each)."""
    ttfts = [0.0] * n
    indices = iter(range(n))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(indices, None)
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def served_load(target: str, prompts: list[list[int]], max_tokens: int, concurrency: int,
                token: str | None = None) -> dict:
    from server.client import NInferClient

    params = sampling(max_tokens)
    with NInferClient(target, token=token, timeout=600) as client:
        client.wait_ready(60)

        def one(i: int) -> float:
            start = time.perf_counter()
            first = None
            for msg in client.generate_stream(prompts[i], sampling=params):
                if msg.token_ids and first is None:
                    first = time.perf_counter() - start
            return first or 0.0

        one(0)  # the channel and the server's threads are warm
        wall, ttfts = drive(one, len(prompts), concurrency)
    return {"wall_s": wall, "ttft_s": ttfts}


def http_load(base_url: str, prompts: list[list[int]], max_tokens: int, concurrency: int, model: str,
              token: str | None = None) -> dict:
    """The same load through the OpenAI-compatible `/v1/completions` (token-id prompts, SSE)."""
    import httpx2

    params = sampling(max_tokens)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx2.Client(base_url=base_url, timeout=600.0, headers=headers,
                       limits=httpx2.Limits(max_connections=concurrency + 1)) as http:
        deadline = time.monotonic() + 60
        while http.get("/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{base_url} did not become healthy")
            time.sleep(0.1)

        def one(i: int) -> float:
            body = {"model": model, "prompt": prompts[i], "stream": True, **params}
            start = time.perf_counter()
            first = None
            with http.stream("POST", "/v1/completions", json=body) as resp:
                resp.raise_for_status()
                for line in resp.iter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.perf_counter() - start
            return first or 0.0

        one(0)
        wall, ttfts = drive(one, len(prompts), concurrency)
    return {"wall_s": wall, "ttft_s": ttfts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prompt_len", type=int, default=32)
    p.add_argument("--max_tokens", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--token", default=None)
    p.add_argument("--model", default=None, help="with an http:// target: the served model's name")
    a = p.parse_args()
    prompts = make_prompts(a.requests, a.prompt_len, a.vocab)
    if a.target.startswith("http://"):
        print(json.dumps(http_load(a.target, prompts, a.max_tokens, a.concurrency, a.model, a.token)))
    else:
        print(json.dumps(served_load(a.target, prompts, a.max_tokens, a.concurrency, a.token)))


if __name__ == "__main__":
    main()
