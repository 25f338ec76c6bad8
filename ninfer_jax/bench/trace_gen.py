"""Synthetic multi-turn traces for `ninfer trace` (docs/trace.md).

    python -m ninfer_jax.bench.trace_gen --kind chat|agent|marconi|agent_long --sessions N --out FILE [--seed 0]

* `chat`: chat-level JSONL. Sessions over a few shared system prompts; every user turn gets an
  assistant reply, some with a reasoning block that the built-in template drops once the next
  user message arrives (Qwen3-style), so the next prompt is not a token extension of the last.
* `agent`: chat-level JSONL. Sessions over a few shared tool sets; each user task runs a tool
  loop (assistant reasoning + tool call, tool result, ...) ending in an answer. Reasoning stays
  in the prompt within a task and is dropped at the next user message.
* `marconi`: token-level JSONL in the Marconi simulator's format, made by the ledger replay
  harness's workload (`cache_replay.workload`: chat and agent sessions, retries, dropped
  reasoning), so both tools replay the same kind of load.
* `agent_long`: token-level JSONL (the Marconi format) at realistic lengths, in the Qwen3
  vocabulary: coding / tool agents over a few shared system prompts + tool schemas (~2k
  tokens); each turn's prompt is the previous prompt + the previous output + a tool result
  (hundreds to several thousand tokens) or, after a final answer, a new user message, at which
  past reasoning is sometimes dropped (the next prompt is then no extension of the last);
  occasional retries (the same prompt again). Sessions grow from ~2k tokens to at most
  --max_prompt (45,000). 200 sessions: about 3,400 requests, 51M prompt and 0.95M output tokens.

Each chat-level line is one request: `session`, `turn`, `ts`, `messages` (the messages this
request adds to the session's history), `tools` (first line of a session), `max_tokens`, and
`reply` (the assistant message appended to the history after the request, the trace's stand-in
for what the model said). Everything is a pure function of --seed.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
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


@functools.cache
def _builtin_frontend():
    from ninfer_jax.frontend import ChatFrontend, Tokenizer

    return ChatFrontend(Tokenizer.builtin(), max_input_tokens=1 << 30)


class _Session:
    """A session's lines as they are written. A request is added only if its prompt, rendered by
    the built-in model's template and tokenizer (the model these traces are made for), leaves
    room for its max_tokens under max_context. The prompt is counted exactly: a characters-per-
    token estimate is no bound (the tools preamble of the template alone is ~190 tokens)."""

    def __init__(self, sid: str, ts: float, tools: list[dict] | None, max_context: int):
        self.sid, self.ts, self.lines = sid, ts, []
        self.tools, self.history, self.max_context = tools, [], max_context

    def fits(self, messages: list[dict], max_tokens: int) -> bool:
        prompt = _builtin_frontend().render_chat(self.history + messages, tools=self.tools)
        return len(prompt.token_ids) + max_tokens <= self.max_context

    def add(self, rng: random.Random, messages: list[dict], reply: dict, max_tokens: int, **extra) -> None:
        line = {"session": self.sid, "turn": len(self.lines), "ts": round(self.ts, 3), "messages": messages}
        line.update(extra)
        line.update(max_tokens=max_tokens, reply=reply)
        self.lines.append(line)
        self.history += messages + [reply]
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


# ---- agent_long: token-level coding / tool agents at realistic lengths -------------------------
# Qwen3 special tokens (the tokenizer's added tokens) and a few role words, so the structure
# looks like a rendered Qwen3 chat; text is drawn uniformly below the special tokens.
QWEN3_VOCAB = 151_936
TEXT_IDS = 151_643  # ids [0, 151643) are ordinary tokens; 151643 is <|endoftext|>
IM_START, IM_END, NL = 151_644, 151_645, 198
THINK, END_THINK = 151_667, 151_668
TOOL_CALL, END_TOOL_CALL = 151_657, 151_658
TOOL_RESPONSE, END_TOOL_RESPONSE = 151_665, 151_666
ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT = 8_948, 872, 77_091


@dataclasses.dataclass(frozen=True)
class AgentLongShape:
    """The knobs of `--kind agent_long` (lengths in tokens, inclusive ranges). The defaults give
    200 sessions about 3,400 requests, 51M prompt and 0.95M output tokens (docs/trace.md)."""

    max_prompt: int = 45_000  # a session ends before a prompt would pass this
    systems: int = 2  # shared system prompts ...
    toolsets: int = 3  # ... times shared tool schemas: the ~2k-token prefixes
    system_len: tuple[int, int] = (500, 900)
    toolset_len: tuple[int, int] = (1_100, 1_500)
    task_len: tuple[int, int] = (40, 700)  # the user's first message and later tasks
    ceiling: tuple[int, int] = (4_000, 45_000)  # each session's own length limit, drawn in this range
    tool_result_median: int = 930  # tool results: log-normal around this, clipped to tool_result_len
    tool_result_len: tuple[int, int] = (80, 6_000)
    reasoning_len: tuple[int, int] = (20, 300)
    call_len: tuple[int, int] = (15, 160)
    answer_len: tuple[int, int] = (60, 700)
    p_answer: float = 0.1  # an output is a final answer (then a new user task follows), else a tool call
    p_drop_reasoning: float = 0.5  # at a new user task, the client drops all past reasoning
    p_retry: float = 0.04  # the same prompt is sent again (a new output)


def _ids(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [int(TEXT_IDS * rng.random()) for _ in range(rng.randint(lo, hi))]


def _message(role: int, body: list[int]) -> list[int]:
    return [IM_START, role, NL] + body + [IM_END, NL]


def agent_long_sessions(n: int, seed: int, shape: AgentLongShape = AgentLongShape()) -> list[list[dict]]:
    """Per session its requests: {session_id, turn_id, ts, input_tokens, output_tokens}."""
    rng = random.Random(f"agent_long:{seed}")
    systems = [_message(ROLE_SYSTEM, _ids(rng, *shape.system_len)) for _ in range(shape.systems)]
    toolsets = [_message(ROLE_SYSTEM, _ids(rng, *shape.toolset_len)) for _ in range(shape.toolsets)]
    header = [IM_START, ROLE_ASSISTANT, NL]
    out = []
    for s in range(n):
        srng = random.Random(f"agent_long:{seed}:{s}:{rng.random()}")
        ceiling = min(shape.max_prompt, srng.randint(*shape.ceiling))
        # The history as segments (reasoning flagged), so a client that drops reasoning can rebuild it.
        segments: list[tuple[bool, list[int]]] = [
            (False, systems[srng.randrange(shape.systems)] + toolsets[srng.randrange(shape.toolsets)]),
            (False, _message(ROLE_USER, _ids(srng, *shape.task_len)))]
        prompt = [t for _, seg in segments for t in seg] + header
        ts, lines = srng.uniform(0, n * 6.0), []
        while True:
            if srng.random() < shape.p_answer:
                reply, answer = [NL] + _ids(srng, *shape.answer_len) + [IM_END], True
            else:
                reply = [NL, TOOL_CALL] + _ids(srng, *shape.call_len) + [END_TOOL_CALL, IM_END]
                answer = False
            reasoning = [THINK] + _ids(srng, *shape.reasoning_len) + [END_THINK]
            output = reasoning + reply
            lines.append({"session_id": s, "turn_id": len(lines), "ts": round(ts, 3),
                          "num_input_tokens": len(prompt), "num_output_tokens": len(output),
                          "input_tokens": prompt, "output_tokens": output})
            ts += srng.uniform(1.0, 20.0)
            if srng.random() < shape.p_retry:  # the client sends the same prompt again
                continue
            segments += [(False, header), (True, reasoning), (False, reply + [NL])]
            if answer:  # a new task from the user; some clients drop the past reasoning here
                nxt = (False, _message(ROLE_USER, _ids(srng, *shape.task_len)))
                if srng.random() < shape.p_drop_reasoning:
                    segments = [seg for seg in segments if not seg[0]]
            else:
                size = round(shape.tool_result_median * math.exp(srng.gauss(0.0, 0.8)))
                size = min(max(size, shape.tool_result_len[0]), shape.tool_result_len[1])
                nxt = (False, _message(ROLE_USER, [TOOL_RESPONSE] + _ids(srng, size, size) + [END_TOOL_RESPONSE]))
            segments.append(nxt)
            following = [t for _, seg in segments for t in seg] + header
            if len(following) > ceiling:
                break
            prompt = following
        out.append(lines)
    return out


def one_off_lines(n: int, seed: int, t_end: float, max_context: int = 2048) -> list[dict]:
    """`n` one-turn chat requests (sessions `oneoff-NNNN`), each with a system prompt of its own,
    at uniform times in [0, t_end): the scan a long-lived service sees between conversation turns
    (classification, extraction, one question), which shares nothing with them or each other."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sess = _Session(f"oneoff-{i:04d}", rng.uniform(0, t_end), None, max_context)
        messages = [{"role": "system", "content": _text(rng, 60, 160)}, {"role": "user", "content": _text(rng, 8, 60)}]
        sess.add(rng, messages, {"role": "assistant", "content": _text(rng, 15, 60)}, rng.randint(16, 48))
        out += sess.lines
    return out


def generate(kind: str, sessions: int, seed: int = 0, max_context: int = 2048,
             shape: AgentLongShape | None = None) -> list[dict]:
    """The trace's lines, in timestamp order. `shape`: agent_long's knobs (default AgentLongShape())."""
    if kind == "marconi":
        return marconi_lines(sessions, seed)
    if kind == "agent_long":
        shape = AgentLongShape() if shape is None else shape
        lines = [line for sess in agent_long_sessions(sessions, seed, shape) for line in sess]
        return sorted(lines, key=lambda line: (line["ts"], line["session_id"], line["turn_id"]))
    make = {"chat": chat_sessions, "agent": agent_sessions}.get(kind)
    if make is None:
        raise ValueError(f"unknown trace kind {kind!r}; choose chat, agent, marconi or agent_long")
    lines = [line for sess in make(sessions, seed, max_context) for line in sess]
    return sorted(lines, key=lambda line: (line["ts"], line["session"], line["turn"]))


def write(lines: list[dict], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ninfer_jax.bench.trace_gen")
    ap.add_argument("--kind", choices=("chat", "agent", "marconi", "agent_long"), default="agent")
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max_context", type=int, default=2048, help="keep each session's prompts under this")
    ap.add_argument("--max_prompt", type=int, default=AgentLongShape.max_prompt,
                    help="agent_long: no prompt longer than this many tokens")
    ap.add_argument("--min_ceiling", type=int, default=AgentLongShape.ceiling[0],
                    help="agent_long: the smallest per-session length limit (each session draws its own in "
                         "[min_ceiling, max_prompt])")
    ap.add_argument("--tool_result_median", type=int, default=AgentLongShape.tool_result_median,
                    help="agent_long: median tool result length in tokens")
    ap.add_argument("--p_answer", type=float, default=AgentLongShape.p_answer,
                    help="agent_long: share of outputs that are a final answer (a new user task follows)")
    ap.add_argument("--p_drop_reasoning", type=float, default=AgentLongShape.p_drop_reasoning,
                    help="agent_long: at a new user task, the chance the client drops all past reasoning")
    ap.add_argument("--p_retry", type=float, default=AgentLongShape.p_retry,
                    help="agent_long: the chance a request is sent again with the same prompt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.sessions < 1:
        ap.error("--sessions must be positive")
    shape = None
    if args.kind == "agent_long":
        if not 4_000 <= args.min_ceiling <= args.max_prompt:  # a first prompt is at most ~3,100 tokens
            ap.error("--min_ceiling must be in [4000, --max_prompt]")
        if args.tool_result_median < 1:
            ap.error("--tool_result_median must be positive")
        for name in ("p_answer", "p_drop_reasoning", "p_retry"):
            if not 0.0 <= getattr(args, name) < 1.0:
                ap.error(f"--{name} must be in [0, 1)")
        shape = AgentLongShape(max_prompt=args.max_prompt, ceiling=(args.min_ceiling, args.max_prompt),
                               tool_result_median=args.tool_result_median, p_answer=args.p_answer,
                               p_drop_reasoning=args.p_drop_reasoning, p_retry=args.p_retry)
    lines = generate(args.kind, args.sessions, args.seed, args.max_context, shape=shape)
    write(lines, args.out)
    note = ""
    if args.kind == "agent_long":
        note = (f", {sum(l['num_input_tokens'] for l in lines):,} prompt tokens, "
                f"{sum(l['num_output_tokens'] for l in lines):,} output tokens, longest prompt "
                f"{max(l['num_input_tokens'] for l in lines):,}")
    print(f"[trace_gen] {args.kind}: {args.sessions} sessions, {len(lines)} requests{note} -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
