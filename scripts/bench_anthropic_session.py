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

from bench_multi_turn import USERS, compare, served

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

    with served(kw) as base:
        client = anthropic.Anthropic(api_key="unused", base_url=base, max_retries=0)
        history, out = [], []
        for text in USERS:
            history.append({"role": "user", "content": text})
            r = client.messages.create(**_body(history, max_tokens), extra_body={"temperature": 0})
            u = r.usage
            out.append((u.cache_read_input_tokens,
                        u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens))
            history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
    return out


def main() -> None:
    compare(__doc__, {"python": python_api, "anthropic_http": over_http})


if __name__ == "__main__":
    main()
