"""Cache markers: what a caller may name, and how markers become exact frontiers (SH-2..7).

A marker names a boundary in the caller's source structure; `resolve_markers` turns each into
an exact token frontier of this rendering, or rejects it with a reason. Equal frontiers merge;
survivors are offered in ascending order (SH-2). The automatic marker the product entry point
adds (SH-3, SH-6) merges with an equal explicit one and yields when four are in use (SH-4,
RD-10: an automatic marker counts among the four).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from .errors import MarkerError
from .identity import FrontierIdentity

if TYPE_CHECKING:  # pragma: no cover
    from .rendering import Rendering

MAX_MARKERS = 4  # SH-2, RD-10
MAX_AUTOMATIC_CANDIDATES = 8  # SH-3: how far back the OpenAI default walks over source parts


@dataclass(frozen=True)
class ContentBoundary:
    """End of text part `part` of message `message` (the whole content when it is a string)."""

    message: int
    part: int = -1


@dataclass(frozen=True)
class MessageBoundary:
    """End of message `message`, template closing included. Keeps the caller's meaning: it is
    never turned into a content boundary (SH-4)."""

    message: int


@dataclass(frozen=True)
class ToolsBoundary:
    """End of the serialisation of tool definition `tool` (-1: the last one)."""

    tool: int = -1


MarkerSpec = Union[ContentBoundary, MessageBoundary, ToolsBoundary]


class MarkerPolicy(str, enum.Enum):
    """Which automatic markers the product entry point asks for (SH-3, SH-6)."""

    NONE = "none"                      # explicit markers only
    OPENAI_DEFAULT = "openai_default"  # end of the last cacheable source part (SH-3)
    STRUCTURE = "structure"            # leading instructions and tools boundaries (SH-6)


def parse_marker(obj: Any) -> MarkerSpec:
    """A spec object, or a dict: {"message": i}, {"message": i, "part": j}, {"tools": true}, {"tool": k}
    with non-negative indices (spec objects may count from the end)."""
    if isinstance(obj, (ContentBoundary, MessageBoundary, ToolsBoundary)):
        return obj
    if not isinstance(obj, Mapping):
        raise MarkerError(f"a cache marker must be a mapping or a marker object, got {type(obj).__name__}")
    keys = set(obj)

    def _int(key: str) -> int:
        value = obj[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise MarkerError(f"cache marker field {key!r} must be an integer")
        if value < 0:
            # The wire form (gRPC, HTTP) counts from the start only: -1 meaning "the last" would
            # silently mark a different message once the conversation grows. Python callers may
            # pass boundary objects, which count from the end with negative indices.
            raise MarkerError(f"cache marker field {key!r} must be a non-negative index, got {value}")
        return value

    if keys == {"message"}:
        return MessageBoundary(_int("message"))
    if keys == {"message", "part"}:
        return ContentBoundary(_int("message"), _int("part"))
    if keys == {"tools"} and obj["tools"] is True:
        return ToolsBoundary()
    if keys == {"tool"}:
        return ToolsBoundary(_int("tool"))
    raise MarkerError(f"unrecognised cache marker {dict(obj)!r}")


@dataclass(frozen=True)
class ResolvedMarker:
    """One save opportunity for a shared entry (SH-1, SH-2) at an exact frontier."""

    frontier: int
    identity: FrontierIdentity
    explicit: tuple[MarkerSpec, ...] = ()   # caller markers merged here, in the caller's order
    automatic: tuple[MarkerSpec, ...] = ()  # automatic markers merged here

    @property
    def is_automatic(self) -> bool:
        return bool(self.automatic)


@dataclass(frozen=True)
class RejectedMarker:
    spec: MarkerSpec
    automatic: bool
    reason: str


@dataclass(frozen=True)
class MarkerPlan:
    markers: tuple[ResolvedMarker, ...]
    rejected: tuple[RejectedMarker, ...]
    automatic_yielded: tuple[MarkerSpec, ...]  # resolved automatic markers that gave way (SH-4)


def normalize_specs(specs: Sequence[MarkerSpec], n_messages: int, n_tools: int,
                    content_parts: Sequence[int]) -> tuple[MarkerSpec, ...]:
    """Resolve negative indices and check ranges; more than four caller markers is an error (SH-2)."""
    if len(specs) > MAX_MARKERS:
        raise MarkerError(f"at most {MAX_MARKERS} cache markers are allowed, got {len(specs)}")
    out: list[MarkerSpec] = []
    for spec in specs:
        if isinstance(spec, ToolsBoundary):
            idx = spec.tool + n_tools if spec.tool < 0 else spec.tool
            if not 0 <= idx < n_tools:
                raise MarkerError(f"cache marker names tool {spec.tool}, the request has {n_tools}")
            out.append(ToolsBoundary(idx))
            continue
        msg = spec.message + n_messages if spec.message < 0 else spec.message
        if not 0 <= msg < n_messages:
            raise MarkerError(f"cache marker names message {spec.message}, the request has {n_messages}")
        if isinstance(spec, MessageBoundary):
            out.append(MessageBoundary(msg))
        else:
            parts = content_parts[msg]
            part = spec.part + parts if spec.part < 0 else spec.part
            if not 0 <= part < parts:
                raise MarkerError(f"cache marker names part {spec.part} of message {msg}, which has {parts}")
            out.append(ContentBoundary(msg, part))
    return tuple(out)


def _locate(spec: MarkerSpec, rendering: "Rendering") -> tuple[int | None, str]:
    """Exact token frontier of one spec in this rendering, or None and why not (SH-7)."""
    if isinstance(spec, MessageBoundary):
        char, why = rendering.message_end(spec.message)
    elif isinstance(spec, ContentBoundary):
        end = rendering.media_end(spec.message, spec.part)
        if end is not None:   # an image or video part ends where its tokens end
            return end, ""
        char, why = rendering.provenance.end_of("content", spec.message, spec.part)
    else:
        char, why = rendering.provenance.end_of("tool", -1, spec.tool)
    if char is None:
        return None, why
    frontier = rendering.exact_frontier(char)
    if frontier is None:
        return None, "not an exact token frontier: the token prefix differs from the source prefix"
    if frontier == 0:
        return None, "empty prefix"
    return frontier, ""


def automatic_candidates(policy: MarkerPolicy, messages: Sequence[Mapping[str, Any]],
                         n_tools: int) -> list[list[MarkerSpec]]:
    """Automatic markers, each a list of fallbacks tried in order (the first that resolves wins)."""
    if policy is MarkerPolicy.NONE:
        return []
    if policy is MarkerPolicy.STRUCTURE:
        # SH-6: a finite set of structure positions: leading instructions, tools.
        groups: list[list[MarkerSpec]] = []
        if messages and messages[0]["role"] in ("system", "developer"):
            groups.append([MessageBoundary(0)])
        if n_tools:
            groups.append([ToolsBoundary(n_tools - 1)])
        return groups
    # SH-3 OpenAI default: end of the last cacheable source part; a structured tool call uses
    # its message boundary; with no message content at all, the tools boundary.
    chain: list[MarkerSpec] = []
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            chain.append(MessageBoundary(i))
        content = msg.get("content")
        # a part with a boundary of its own: non-empty text, or an image or video
        texts = [content] if isinstance(content, str) else [p.get("text") or p["type"] in ("image", "video")
                                                             for p in content or ()]
        for part in range(len(texts) - 1, -1, -1):
            if texts[part]:  # an empty part has no boundary of its own
                chain.append(ContentBoundary(i, part))
        if len(chain) >= MAX_AUTOMATIC_CANDIDATES:
            break
    chain = chain[:MAX_AUTOMATIC_CANDIDATES]
    if not chain and n_tools:
        chain.append(ToolsBoundary(n_tools - 1))
    return [chain] if chain else []


def resolve_markers(rendering: "Rendering", explicit: Sequence[MarkerSpec],
                    automatic: Sequence[Sequence[MarkerSpec]]) -> MarkerPlan:
    """SH-2..4: resolve, merge equal frontiers, let automatic markers merge or yield."""
    by_frontier: dict[int, dict[str, list[MarkerSpec]]] = {}
    rejected: list[RejectedMarker] = []
    for spec in explicit:
        frontier, why = _locate(spec, rendering)
        if frontier is None:
            rejected.append(RejectedMarker(spec, False, why))
            continue
        by_frontier.setdefault(frontier, {"explicit": [], "automatic": []})["explicit"].append(spec)
    yielded: list[MarkerSpec] = []
    for chain in automatic:
        reasons: list[str] = []
        for spec in chain:
            frontier, why = _locate(spec, rendering)
            if frontier is None:
                reasons.append(f"{spec}: {why}")
                continue
            if frontier in by_frontier:          # SH-4: merge with an equal marker
                by_frontier[frontier]["automatic"].append(spec)
            elif len(by_frontier) < MAX_MARKERS:
                by_frontier[frontier] = {"explicit": [], "automatic": [spec]}
            else:                                # SH-4: four in use, the automatic one yields
                yielded.append(spec)
            break
        else:
            rejected.append(RejectedMarker(chain[0], True, "; ".join(reasons)))
    markers = tuple(
        ResolvedMarker(frontier=f, identity=rendering.identity(f), explicit=tuple(v["explicit"]),
                       automatic=tuple(v["automatic"]))
        for f, v in sorted(by_frontier.items())
    )
    return MarkerPlan(markers, tuple(rejected), tuple(yielded))
