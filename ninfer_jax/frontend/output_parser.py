"""Generated assistant text back into structured form: reasoning, content and tool calls.

Reads the Qwen3 / Hermes conventions the built-in template writes: an optional
`<think>…</think>` block, then content, then `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
blocks. A block that is not a valid call stays in the content (the model's text is never lost).
The structured result is what a client sends back next turn, and the template renders it in its
normalised form, which is why the next prompt may stop matching E (SCN-1).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    reasoning_content: str | None
    tool_calls: tuple[dict, ...]

    def as_message(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.content or None}
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        elif msg["content"] is None:
            msg["content"] = ""
        return msg


def _call(body: str) -> dict | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    args = data.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {"type": "function", "function": {"name": data["name"], "arguments": args}}


def parse_assistant_output(text: str, *, call_id_prefix: str = "call_") -> ParsedOutput:
    reasoning = None
    if THINK_CLOSE in text:
        head, _, text = text.partition(THINK_CLOSE)
        head = head.split(THINK_OPEN, 1)[-1]
        reasoning = head.strip("\n")
    calls: list[dict] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        call = _call(match.group(1))
        kept.append(text[last:match.start()] if call is not None else text[last:match.end()])
        last = match.end()
        if call is not None:
            call["id"] = f"{call_id_prefix}{len(calls)}"
            calls.append(call)
    kept.append(text[last:])
    return ParsedOutput("".join(kept).strip("\n"), reasoning, tuple(calls))
