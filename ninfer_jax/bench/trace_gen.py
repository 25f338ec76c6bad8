"""Synthetic multi-turn traces for `ninfer trace` (docs/trace.md).

    python -m ninfer_jax.bench.trace_gen --kind chat|agent|marconi --sessions N --out FILE [--seed 0]

* `chat`: chat-level JSONL. Sessions over a few shared system prompts; every user turn gets an
  assistant reply, some with a reasoning block that the built-in template drops once the next
  user message arrives (Qwen3-style), so the next prompt is not a token extension of the last.
* `agent`: chat-level JSONL. Sessions over a few shared tool sets; each user task runs a tool
  loop (assistant reasoning + tool call, tool result, ...) ending in an answer. Reasoning stays
  in the prompt within a task and is dropped at the next user message.
* `marconi`: token-level JSONL in the Marconi simulator's format, made by the ledger replay
  harness's workload (`cache_replay.workload`: chat and agent sessions, retries, dropped
  reasoning), so both tools replay the same kind of load.

Each chat-level line is one request: `session`, `turn`, `ts`, `messages` (the messages this
request adds to the session's history), `tools` (first line of a session), `max_tokens`, and
`reply` (the assistant message appended to the history after the request, the trace's stand-in
for what the model said). Everything is a pure function of --seed.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

WORDS = (
    "the a of to and in is for on with that this it from by as be are at or an not we can will "
    "file data model list value number table user system request result error config server "
    "cache token page state query search read write run code test check build update return "
    "function method class object string field key index memory device host time date city "
    "weather report summary plan step task answer question example detail option setting path "
    "first next last new old small large fast slow good simple clear exact short long open close"
).split()
TOOL_NAMES = ("get_weather", "search", "read_file", "write_file", "run_code", "calculator", "lookup",
              "list_dir", "send_mail", "fetch_url", "query_db", "translate")
ARG_KEYS = ("city", "query", "path", "text", "unit", "limit", "code", "expression", "to", "zone")
SHARED_PREFIXES = 3  # distinct system prompts (chat) and tool sets (agent)


def _text(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "."


def _tool(rng: random.Random, name: str) -> dict:
    keys = rng.sample(ARG_KEYS, rng.randint(1, 3))
    return {"type": "function", "function": {
        "name": name, "description": _text(rng, 6, 16),
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": _text(rng, 3, 8)}
                                                        for k in keys}, "required": keys[:1]}}}


def _tool_call(rng: random.Random, tools: list[dict], call_id: str) -> dict:
    fn = rng.choice(tools)["function"]
    args = {k: rng.choice([rng.choice(WORDS), rng.randint(0, 999)]) for k in fn["parameters"]["properties"]}
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}}


class _Session:
    """A session's lines as they are written. `tokens` over-estimates its prompt length (2.5
    characters of JSON per token; the built-in tokenizer takes ~2.7-4), so a session that stays
    under budget leaves room for max_tokens under max_context."""

    CHARS_PER_TOKEN = 2.5

    def __init__(self, sid: str, ts: float, prefix: object, max_context: int):
        self.sid, self.ts, self.lines = sid, ts, []
        self.chars, self.max_context = len(json.dumps(prefix)), max_context

    def fits(self, messages: list[dict], max_tokens: int) -> bool:
        chars = self.chars + len(json.dumps(messages))
        return chars / self.CHARS_PER_TOKEN + max_tokens + 16 <= self.max_context

    def add(self, rng: random.Random, messages: list[dict], reply: dict, max_tokens: int, **extra) -> None:
        line = {"session": self.sid, "turn": len(self.lines), "ts": round(self.ts, 3), "messages": messages}
        line.update(extra)
        line.update(max_tokens=max_tokens, reply=reply)
        self.lines.append(line)
        self.chars += len(json.dumps(messages)) + len(json.dumps(reply))
        self.ts += rng.uniform(0.5, 4.0)


def chat_sessions(n: int, seed: int, max_context: int = 2048) -> list[list[dict]]:
    rng = random.Random(seed)
    systems = [_text(rng, 60, 120) for _ in range(SHARED_PREFIXES)]
    out = []
    for s in range(n):
        system = rng.choice(systems)
        sess = _Session(f"chat-{s:04d}", rng.uniform(0, n * 0.5), None, max_context)
        messages = [{"role": "system", "content": system}]
        for _ in range(rng.randint(2, 6)):
            user = {"role": "user", "content": _text(rng, 8, 40)}
            reply = {"role": "assistant", "content": _text(rng, 15, 60)}
            if rng.random() < 0.5:  # a thinking reply; the template drops it at the next user turn
                reply["reasoning_content"] = _text(rng, 15, 50)
            max_tokens = rng.randint(16, 48)
            if not sess.fits(messages + [user], max_tokens):
                break
            sess.add(rng, messages + [user], reply, max_tokens)
            messages = []
        out.append(sess.lines)
    return out


def agent_sessions(n: int, seed: int, max_context: int = 2048) -> list[list[dict]]:
    rng = random.Random(seed)
    few = max_context < 1024  # a small context holds one tool definition, not four
    toolsets = [[_tool(rng, name) for name in rng.sample(TOOL_NAMES, 1 if few else rng.randint(2, 4))]
                for _ in range(SHARED_PREFIXES)]
    systems = [_text(rng, 20, 50) for _ in range(SHARED_PREFIXES)]
    out = []
    for s in range(n):
        k = rng.randrange(SHARED_PREFIXES)
        tools = toolsets[k]
        sess = _Session(f"agent-{s:04d}", rng.uniform(0, n * 0.5), tools, max_context)
        pending = [{"role": "system", "content": systems[k]}]
        calls = 0
        for _task in range(rng.randint(1, 3)):
            pending.append({"role": "user", "content": _text(rng, 8, 25)})
            steps = rng.randint(1, 3)  # tool calls before the answer, unless it answers earlier
            for step in range(steps + 1):
                final = step == steps or (step > 0 and rng.random() < 0.3)
                reply = {"role": "assistant", "reasoning_content": _text(rng, 10, 35)}
                if final:
                    reply["content"] = _text(rng, 10, 40)
                else:
                    calls += 1
                    reply["content"] = ""
                    reply["tool_calls"] = [_tool_call(rng, tools, f"call_{calls}")]
                max_tokens = rng.randint(24, 64)
                if not sess.fits(pending, max_tokens):
                    break  # the session ends here, under its context budget
                extra = {"tools": tools} if not sess.lines else {}
                sess.add(rng, pending, reply, max_tokens, **extra)
                if final:
                    pending = []
                    break
                pending = [{"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                            "content": json.dumps({"result": _text(rng, 8, 40), "ok": rng.random() < 0.8})}]
            if pending:  # stopped mid-task
                break
        out.append(sess.lines)
    return out


def marconi_lines(n: int, seed: int, turns: int = 6) -> list[dict]:
    """The ledger replay workload as Marconi token-level lines (ids in the built-in vocabulary)."""
    from ninfer_jax.bench.cache_replay import workload

    rng = random.Random(seed + 1)
    turn_of: dict[int, int] = {}
    out, ts = [], 0.0
    for r in workload(n, turns, seed):
        sid = r["session"]
        turn_of[sid] = turn_of.get(sid, -1) + 1
        ts += rng.expovariate(4.0)
        out.append({"session_id": sid, "turn_id": turn_of[sid], "ts": round(ts, 4),
                    "num_input_tokens": len(r["tokens"]), "num_output_tokens": len(r["output"]),
                    "input_tokens": list(r["tokens"]), "output_tokens": list(r["output"])})
    return out


def generate(kind: str, sessions: int, seed: int = 0, max_context: int = 2048) -> list[dict]:
    """The trace's lines, in timestamp order."""
    if kind == "marconi":
        return marconi_lines(sessions, seed)
    make = {"chat": chat_sessions, "agent": agent_sessions}.get(kind)
    if make is None:
        raise ValueError(f"unknown trace kind {kind!r}; choose chat, agent or marconi")
    lines = [line for sess in make(sessions, seed, max_context) for line in sess]
    return sorted(lines, key=lambda line: (line["ts"], line["session"], line["turn"]))


def write(lines: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ninfer_jax.bench.trace_gen")
    ap.add_argument("--kind", choices=("chat", "agent", "marconi"), default="agent")
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max_context", type=int, default=2048, help="keep each session's prompts under this")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.sessions < 1:
        ap.error("--sessions must be positive")
    lines = generate(args.kind, args.sessions, args.seed, args.max_context)
    write(lines, args.out)
    print(f"[trace_gen] {args.kind}: {args.sessions} sessions, {len(lines)} requests -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
