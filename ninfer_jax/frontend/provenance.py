"""Source provenance: where each caller-supplied source lies in the rendered text.

The template is rendered a second time with every non-empty text part, reasoning block and tool
definition replaced by a unique sentinel. Substituting the real texts back into that rendering
must give the real rendering character for character; only then are the sentinel positions
proven to be the sources' positions (the template treated them as opaque text). A template that
inspects or transforms a source (strip, split, `in` tests that differ) fails the check and
proves nothing: content boundaries are then not offered (REC-7, SH-7).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

OPEN, CLOSE = "\ue000", "\ue001"
_SENTINEL = re.compile(OPEN + r"(\d+)" + CLOSE)

KIND_CONTENT = "content"
KIND_REASONING = "reasoning"
KIND_TOOL = "tool"


@dataclass(frozen=True)
class SourceSpan:
    """Characters [start, end) of the rendering hold source `kind` (message, part) verbatim.
    Tool definitions use message -1 and part = tool index."""

    kind: str
    message: int
    part: int
    start: int
    end: int


@dataclass(frozen=True)
class Provenance:
    proven: bool
    reason: str
    spans: tuple[SourceSpan, ...] = ()
    omitted: tuple[tuple[str, int, int], ...] = ()     # sources the rendering leaves out
    duplicated: tuple[tuple[str, int, int], ...] = ()  # sources rendered more than once

    def find(self, kind: str, message: int, part: int) -> SourceSpan | None:
        for span in self.spans:
            if (span.kind, span.message, span.part) == (kind, message, part):
                return span
        return None

    def end_of(self, kind: str, message: int, part: int) -> tuple[int | None, str]:
        if not self.proven:
            return None, f"source provenance not proven: {self.reason}"
        span = self.find(kind, message, part)
        if span is not None:
            return span.end, ""
        key = (kind, message, part)
        if key in self.omitted:
            return None, "the template omits this source"
        if key in self.duplicated:
            return None, "the template renders this source more than once"
        return None, "empty source: no boundary of its own"

    def spans_overlapping(self, lo: int, hi: int) -> list[SourceSpan]:
        """Spans with at least one character in [lo, hi), or empty spans strictly inside."""
        return [s for s in self.spans if (s.start < hi and s.end > lo) or (lo < s.start < hi)]

    def message_spans(self, message: int, kind: str = KIND_CONTENT) -> list[SourceSpan]:
        return sorted((s for s in self.spans if s.message == message and s.kind == kind), key=lambda s: s.part)


RenderFn = Callable[[Sequence[Mapping[str, Any]], Callable[[Any, str], str]], str]


def _sentinel(sid: int) -> str:
    return f"{OPEN}{sid}{CLOSE}"


def trace(render: RenderFn, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
          real_text: str) -> Provenance:
    """Prove source positions in `real_text` (see the module doc). `render(messages, tojson_hook)`
    must render exactly like the real rendering apart from the messages given."""
    sources: dict[int, tuple[str, int, int, str]] = {}
    sent_messages: list[dict] = []
    for i, msg in enumerate(messages):
        m = copy.deepcopy(dict(msg))
        content = m.get("content")
        if isinstance(content, str):
            if content:
                sid = len(sources)
                sources[sid] = (KIND_CONTENT, i, 0, content)
                m["content"] = _sentinel(sid)
        elif content is not None:
            for j, part in enumerate(content):
                if part.get("text"):  # an image or video part has no text: the template's own
                    sid = len(sources)
                    sources[sid] = (KIND_CONTENT, i, j, part["text"])
                    part["text"] = _sentinel(sid)
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            sid = len(sources)
            sources[sid] = (KIND_REASONING, i, 0, reasoning)
            m["reasoning_content"] = _sentinel(sid)
        sent_messages.append(m)
    for _, _, _, text in sources.values():
        if OPEN in text or CLOSE in text:
            return Provenance(False, "a source contains the provenance sentinel characters")
    expected = {(k, i, j) for k, i, j, _ in sources.values()} | {(KIND_TOOL, -1, k) for k in range(len(tools))}

    def tojson_hook(value: Any, text: str) -> str:
        for k, tool in enumerate(tools):
            if value is tool or value is tool.get("function"):
                sid = len(sources)
                sources[sid] = (KIND_TOOL, -1, k, text)
                return _sentinel(sid)
        return text

    try:
        sentinel_text = render(sent_messages, tojson_hook)
    except Exception as exc:  # a template that fails on sentinel text proves nothing
        return Provenance(False, f"sentinel rendering failed: {exc}")
    pieces: list[str] = []
    found: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    pos = 0
    last = 0
    for match in _SENTINEL.finditer(sentinel_text):
        literal = sentinel_text[last:match.start()]
        pieces.append(literal)
        pos += len(literal)
        sid = int(match.group(1))
        if sid not in sources:
            return Provenance(False, "the template produced an unknown sentinel")
        kind, i, j, text = sources[sid]
        pieces.append(text)
        found.setdefault((kind, i, j), []).append((pos, pos + len(text)))
        pos += len(text)
        last = match.end()
    pieces.append(sentinel_text[last:])
    if "".join(pieces) != real_text:
        return Provenance(False, "the template transforms or inspects source text")
    spans = tuple(
        SourceSpan(kind, i, j, where[0][0], where[0][1])
        for (kind, i, j), where in sorted(found.items(), key=lambda kv: kv[1][0])
        if len(where) == 1
    )
    duplicated = tuple(sorted(key for key, where in found.items() if len(where) > 1))
    omitted = tuple(sorted(expected - set(found)))
    return Provenance(True, "", spans, omitted, duplicated)
