"""A 5-turn chat on the built-in model, each turn's reply sent back as the client got it: the
prompt tokens the engine bound from the context cache, through the Python API (the history
`ninfer chat` builds, `trace_replay.assistant_message`) and through the OpenAI HTTP API (the
official `openai` client against a loopback server), each on a fresh engine. Issue 36: the two
must agree, and a reply must render back whole (docs/http.md, Round trip).

    PYTHONPATH=. python scripts/bench_multi_turn.py [--max_tokens 24]
"""
from __future__ import annotations

import argparse
import contextlib
import json

USERS = ["Tell me about cats.", "And dogs?", "Which is older?", "Why?", "Thanks, one more fact."]
MODEL = "builtin:tiny-hybrid"


def python_api(kw: dict, max_tokens: int) -> list[tuple[int, int]]:
    from ninfer_jax import Engine, EngineConfig, SamplingParams
    from ninfer_jax.bench.trace_replay import assistant_message

    engine, history, out = Engine(EngineConfig(**kw)), [], []
    try:
        for text in USERS:
            history.append({"role": "user", "content": text})
            done = engine.submit_chat(history, session="s",
                                      sampling=SamplingParams(temperature=0, max_tokens=max_tokens)).result()
            out.append((done.usage.cached_tokens, done.usage.prompt_tokens))
            history.append(assistant_message(engine.tokenizer, done.token_ids))
    finally:
        engine.close()
    return out


@contextlib.contextmanager
def served(kw: dict):
    """A loopback HTTP server of the built-in model on a fresh engine; yields its base URL."""
    from server.app import InferenceServer
    from server.cli_commands import engine_factory

    srv = InferenceServer(engine_factory(MODEL, **kw), port=None, http_port=0, grace_s=2.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    try:
        yield f"http://127.0.0.1:{srv.http.port}"
    finally:
        srv.shutdown(grace_s=2.0)


def over_http(kw: dict, max_tokens: int) -> list[tuple[int, int]]:
    import openai

    with served(kw) as base:
        client = openai.OpenAI(api_key="unused", base_url=f"{base}/v1", max_retries=0)
        history, out = [], []
        for text in USERS:
            history.append({"role": "user", "content": text})
            r = client.chat.completions.create(model=MODEL, messages=history, max_tokens=max_tokens, temperature=0,
                                               extra_body={"session": "s"})
            out.append((r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens))
            history.append({"role": "assistant", "content": r.choices[0].message.content})
    return out


def compare(doc: str, runs: dict) -> None:
    """Run each of `runs` ({name: fn(engine kwargs, max_tokens) -> [(cached, prompt) per turn]})
    on a fresh engine, print each one's turns and the JSON of all, `equal` when all agree."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--max_tokens", type=int, default=24)
    a = ap.parse_args()
    kw = dict(max_concurrency=2, max_context=1024, progress=False)
    figures = {}
    for name, run in runs.items():
        turns = run(kw, a.max_tokens)
        cached, prompt = sum(c for c, _ in turns), sum(p for _, p in turns)
        figures[name] = {"turns": [{"cached_tokens": c, "prompt_tokens": p} for c, p in turns],
                         "cached_fraction": round(cached / prompt, 4)}
        print(f"{name}: cached/prompt per turn {[f'{c}/{p}' for c, p in turns]}, "
              f"all turns {cached}/{prompt} = {cached / prompt:.3f}")
    figures["equal"] = len({json.dumps(f["turns"]) for f in figures.values()}) == 1
    print(json.dumps(figures))


def main() -> None:
    compare(__doc__, {"python": python_api, "http": over_http})


if __name__ == "__main__":
    main()
