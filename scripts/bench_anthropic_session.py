"""An agent session through Anthropic's Messages API against the Python API (issue 37): five turns
on the built-in model with `cache_control` on the system prompt and the tool definitions and the
request-level `cache_control` (Anthropic's automatic marker, at the last cacheable block), each
reply appended as the client got it. Per turn, the prompt tokens the engine reused, through the
official `anthropic` client against a loopback server and through `Engine.submit_chat` with the
same conversation (server/anthropic_convert.py's translation), each on a fresh engine: the two
must agree.

    PYTHONPATH=. python scripts/bench_anthropic_session.py [--max_tokens 24]
"""
from __future__ import annotations

import argparse
import json

USERS = ["Tell me about cats.", "And dogs?", "Which is older?", "Why?", "Thanks, one more fact."]
MODEL = "builtin:tiny-hybrid"
SYSTEM = [{"type": "text", "text": "You are a concise assistant for a pet magazine. Keep answers short.",
           "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "lookup", "description": "Look a fact up in the magazine's archive.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
          "cache_control": {"type": "ephemeral"}}]
AUTO = {"type": "ephemeral"}


def _body(history: list, max_tokens: int) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "system": SYSTEM, "tools": TOOLS, "messages": history,
            "cache_control": AUTO}


def python_api(kw: dict, max_tokens: int) -> list[tuple[int, int]]:
    from ninfer_jax import Engine, EngineConfig, SamplingParams
    from ninfer_jax.frontend.output_parser import THINK_OPEN, OutputStream
    from server import anthropic_convert as ac

    engine, history, out = Engine(EngineConfig(**kw)), [], []
    try:
        for text in USERS:
            history.append({"role": "user", "content": text})
            chat = ac.chat_of(ac.parse(ac.MessagesRequest, _body(history, max_tokens)))
            done = engine.submit_chat(chat["messages"], tools=chat["tools"],
                                      sampling=SamplingParams(temperature=0, max_tokens=max_tokens)).result()
            out.append((done.usage.cached_tokens, done.usage.prompt_tokens))
            prompt = engine.chat_frontend().render_chat(chat["messages"], tools=chat["tools"]).text
            stream = OutputStream(think_open=prompt.rstrip().endswith(THINK_OPEN))  # as the server reads it
            stream.push(done.text)
            history.append({"role": "assistant", "content": ac.content_blocks(stream.parsed())})
    finally:
        engine.close()
    return out


def over_http(kw: dict, max_tokens: int) -> list[tuple[int, int]]:
    import anthropic

    from server.app import InferenceServer
    from server.cli_commands import engine_factory

    srv = InferenceServer(engine_factory(MODEL, **kw), port=None, http_port=0, grace_s=2.0, progress=lambda m: None)
    srv.start()
    srv.warm_up()
    try:
        client = anthropic.Anthropic(api_key="unused", base_url=f"http://127.0.0.1:{srv.http.port}", max_retries=0)
        history, out = [], []
        for text in USERS:
            history.append({"role": "user", "content": text})
            body = _body(history, max_tokens)
            r = client.messages.create(**body, extra_body={"temperature": 0})
            u = r.usage
            out.append((u.cache_read_input_tokens,
                        u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens))
            history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
    finally:
        srv.shutdown(grace_s=2.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max_tokens", type=int, default=24)
    a = ap.parse_args()
    kw = dict(max_concurrency=2, max_context=1024, progress=False)
    figures = {}
    for name, run in (("python", python_api), ("anthropic_http", over_http)):
        turns = run(kw, a.max_tokens)
        cached, prompt = sum(c for c, _ in turns), sum(p for _, p in turns)
        figures[name] = {"turns": [{"cached_tokens": c, "prompt_tokens": p} for c, p in turns],
                         "cached_fraction": round(cached / prompt, 4)}
        print(f"{name}: cached/prompt per turn {[f'{c}/{p}' for c, p in turns]}, "
              f"all turns {cached}/{prompt} = {cached / prompt:.3f}")
    figures["equal"] = figures["python"]["turns"] == figures["anthropic_http"]["turns"]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
