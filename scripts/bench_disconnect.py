"""From a client's going to the server's cancel of its request, over the OpenAI HTTP API: the
fake engine (a token every 50 ms, 2,000 to go), 20 requests each way: a non-streaming call whose
read times out after 0.3 s, and a stream closed after its fourth chunk. Measured from the client's
timeout or close to the server's `handle.cancel()` (the engine then ends the request at its next
step). docs/http.md, Errors.

    PYTHONPATH=. python scripts/bench_disconnect.py
"""
from __future__ import annotations

import statistics
import time

import httpx2

from server.app import InferenceServer
from server.fake_engine import FakeEngine, FakeHandle

CANCELS: list[float] = []
_cancel = FakeHandle.cancel


def _recorded_cancel(self) -> None:
    CANCELS.append(time.perf_counter())
    _cancel(self)


def one(base: str, k: int, stream: bool) -> float:
    body = {"model": "fake:tiny", "messages": [{"role": "user", "content": f"hi {k}"}], "max_tokens": 2000,
            "stream": stream}
    with httpx2.Client(timeout=httpx2.Timeout(10.0, read=0.3)) as http:
        if stream:
            with http.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
                for i, _ in enumerate(resp.iter_raw()):
                    if i == 3:
                        break
            gone = time.perf_counter()  # the response (and its connection) closed
        else:
            try:
                http.post(f"{base}/v1/chat/completions", json=body)
                raise RuntimeError("the call finished: nothing to measure")
            except httpx2.ReadTimeout:
                gone = time.perf_counter()
    return gone


def main() -> None:
    FakeHandle.cancel = _recorded_cancel
    fake = FakeEngine(max_concurrency=2, max_context=4096, step_s=0.05, min_len=2000, max_len=2000, model="fake:tiny")
    srv = InferenceServer(lambda: fake, port=None, http_port=0, grace_s=2.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    base = f"http://127.0.0.1:{srv.http.port}"
    try:
        for stream in (False, True):
            ms = []
            for k in range(20):
                before = fake.stats()["requests_cancelled"]
                gone = one(base, k, stream)
                while fake.stats()["requests_cancelled"] == before:
                    time.sleep(0.0005)
                ms.append((CANCELS[-1] - gone) * 1e3)
            print(f"{'stream' if stream else 'non-stream'}: median {statistics.median(ms):.1f} ms, "
                  f"max {max(ms):.1f} ms")
    finally:
        srv.shutdown(grace_s=1.0)
        fake.close()


if __name__ == "__main__":
    main()
