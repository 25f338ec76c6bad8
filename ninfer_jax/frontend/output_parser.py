"""Generated assistant text back into structured form: reasoning, content and tool calls.

Reads the Qwen3 / Hermes conventions the built-in template writes: an optional
`<think>…</think>` block, then content, then `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
blocks, or those blocks in the XML form of Qwen3.5's and Qwen3-Coder's templates
(`<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`). A block that is not a valid call stays in the content (the model's text is never lost).
The structured result is what a client sends back next turn, and the template renders it in its
normalised form, which is why the next prompt may stop matching E (SCN-1).

Round trip: the content is the generated text with only the structural parts taken out, and of
the text around them only the separators a ChatML template writes back when it renders the message
(`<think>\n` … `\n</think>\n\n` around the reasoning, one newline before each tool call). Its own
leading and trailing newlines stay, so a verbatim template (the built-in one) renders turn N's
message back to exactly the text generated and turn N+1 reuses turn N whole. A template that
strips or trims content itself (Qwen's `lstrip`) loses only what it strips.
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


_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _call(body: str) -> dict | None:
    if body.startswith("<function="):
        return _xml_call(body)
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


def _xml_call(body: str) -> dict | None:
    """The XML form of Qwen3.5's and Qwen3-Coder's templates: `<function=NAME>` then
    `<parameter=KEY>\nVALUE\n</parameter>` blocks; nothing else but whitespace between them."""
    match = _XML_FUNCTION.fullmatch(body)
    if match is None or not match.group(1).strip():
        return None
    args: dict = {}
    rest, pos = match.group(2), 0
    for p in _XML_PARAMETER.finditer(rest):
        if rest[pos:p.start()].strip():
            return None
        args[p.group(1).strip()] = _xml_value(p.group(2))
        pos = p.end()
    if rest[pos:].strip():
        return None
    return {"type": "function", "function": {"name": match.group(1).strip(), "arguments": args}}


def _xml_value(text: str):
    """A parameter's value: the JSON value it spells where the template renders that value back
    to the same text (objects and arrays as `tojson`, numbers as `string`), else the text itself.
    So `5` is 5 and `{"a": 1}` an object, but `true` stays "true" (the template would write
    `True`), and the next turn renders exactly what was generated."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text
    if isinstance(value, (dict, list)):
        back = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        back = str(value)
    else:
        return text
    return value if back == text else text


def parse_assistant_output(text: str, *, call_id_prefix: str = "call_", reasoning: bool = True,
                           tool_calls: bool = True) -> ParsedOutput:
    """`reasoning=False` reads no `<think>` block (a stream that decided it has none);
    `tool_calls=False` leaves `<tool_call>` blocks in the content (a request that allows none)."""
    if reasoning and THINK_CLOSE in text:
        head, _, text = text.partition(THINK_CLOSE)
        head = head.split(THINK_OPEN, 1)[-1]
        thought = _cut(_cut(head, "\n", lead=True), "\n")  # the template's `<think>\n` and `\n</think>`
        text = _cut(text, "\n\n", lead=True) if text.startswith("\n\n") else _cut(text, "\n", lead=True)
    else:
        thought = None
    calls: list[dict] = []
    kept: list[str] = []
    last = 0
    for match in (_TOOL_CALL.finditer(text) if tool_calls else ()):
        call = _call(match.group(1))
        if call is None:
            kept.append(text[last:match.end()])
        else:  # the newline the template writes before each call is the call's, not content
            before = text[last:match.start()]
            if not calls and match.group(1).startswith("<function=") and before.endswith("\n\n"):
                before = before[:-1]  # the XML form's templates write two before the first call
            kept.append(_cut(before, "\n"))
            call["id"] = f"{call_id_prefix}{len(calls)}"
            calls.append(call)
        last = match.end()
    kept.append(text[last:])
    return ParsedOutput("".join(kept), thought, tuple(calls))


def _cut(text: str, sep: str, lead: bool = False) -> str:
    """`text` without one `sep` at its start (`lead`) or end, where it has one."""
    if lead:
        return text[len(sep):] if text.startswith(sep) else text
    return text[:-len(sep)] if text.endswith(sep) else text



_MARKERS = ("<tool_call>", THINK_OPEN, THINK_CLOSE)


def _held_tail(text: str) -> int:
    """How many trailing characters could still be the start of a markup tag, or are newlines
    the parse would take as a separator if a tool call or `</think>` followed them."""
    hold = 0
    for marker in _MARKERS:
        for n in range(min(len(marker) - 1, len(text)), hold, -1):
            if text.endswith(marker[:n]):
                hold = n
                break
    rest = text[:len(text) - hold]
    return hold + len(rest) - len(rest.rstrip("\n"))  # the newlines before a tag's start too


class OutputStream:
    """`parse_assistant_output` for a stream: `push` generated text as it comes and get the
    content and reasoning deltas that are final; `finish` returns the rest and the tool calls.

    Nothing emitted is taken back: the content deltas add up to the final parse's `content`,
    the reasoning deltas to its `reasoning_content`, and the tool calls come with `finish`. So
    text is held while it could still change meaning: an open `<tool_call>` block (it may
    become a call), a tail that may start a tag, trailing newlines (a separator if a call follows), and a
    reasoning block until its `</think>` arrives. Whether the output has a reasoning block is
    decided once: the prompt opened one (`think_open`, a template whose generation prompt ends
    in `<think>`), or the output starts with `<think>`; otherwise a later `</think>` is plain
    text (`parse(..., reasoning=False)`), so content streams as it is generated.
    """

    def __init__(self, *, think_open: bool = False, tool_calls: bool = True, call_id_prefix: str = "call_"):
        self._text = ""
        self._tools = tool_calls
        self._prefix = call_id_prefix
        self._reasoning_mode: bool | None = True if think_open else None
        self._content = 0  # characters of content emitted
        self._reasoning = 0

    @property
    def reasoning(self) -> bool:
        return bool(self._reasoning_mode)

    def _parse(self, text: str) -> ParsedOutput:
        return parse_assistant_output(text, call_id_prefix=self._prefix, reasoning=self.reasoning,
                                      tool_calls=self._tools)

    def _deltas(self, parsed: ParsedOutput) -> tuple[str, str]:
        content = parsed.content[self._content:]
        reasoning = (parsed.reasoning_content or "")[self._reasoning:]
        self._content += len(content)
        self._reasoning += len(reasoning)
        return content, reasoning

    def push(self, text: str) -> tuple[str, str]:
        """Add generated text; returns (content delta, reasoning delta), either possibly empty."""
        self._text += text
        full = self._text
        if self._reasoning_mode is None:
            lead = full.lstrip("\n")
            if lead.startswith(THINK_OPEN):
                self._reasoning_mode = True
            elif THINK_OPEN.startswith(lead):
                return "", ""  # it may still open a reasoning block
            else:
                self._reasoning_mode = False
        start = 0
        if self._reasoning_mode:
            if THINK_CLOSE not in full:
                return "", ""
            start = full.index(THINK_CLOSE) + len(THINK_CLOSE)
        safe = full[:max(start, len(full) - _held_tail(full))]
        opened = safe.rfind("<tool_call>", start) if self._tools else -1
        if opened >= 0 and "</tool_call>" not in safe[opened:]:
            safe = safe[:opened].rstrip("\n")  # held with the block: the call's separator if it is one
        return self._deltas(self._parse(safe))

    def finish(self) -> tuple[str, str, tuple[dict, ...]]:
        """The remaining (content delta, reasoning delta) and the tool calls of the whole text."""
        if self._reasoning_mode is None:
            self._reasoning_mode = self._text.lstrip("\n").startswith(THINK_OPEN)
        content, reasoning = self._deltas(self._parse(self._text))
        return content, reasoning, self._parse(self._text).tool_calls

    def parsed(self) -> ParsedOutput:
        """The whole text's parse, under the stream's decision about reasoning."""
        return self._parse(self._text)
