"""Typed rewrite points and the actual input recovery position (REC-3..8).

Layout of one request (REC-7):

    [user header][body] C [template closing] R [assistant generation header] P

* `ResponseReplay` R (REC-3): just before the current assistant response starts, i.e. the end
  of the last message. Upper bound for retries, structured tool calls, normalised history.
* `TurnClosure` R (REC-4): before the first assistant start after the current real user
  message. Upper bound for a new user turn that rewrites the open turn (a template that drops
  the reasoning of past assistant turns rewrites everything after it).
* REC-6a: the typed R is chosen from the rendering and a next-user probe (this conversation +
  a reply + a new user message, rendered): ResponseReplay when the probe keeps the prompt up to
  it, else TurnClosure when the probe keeps that, else no typed R (recovery at P, REC-6).
* REC-5/7: the recovery position is C only when provenance proves C→R right after a user /
  system / developer message is pure template closing, nothing of that message is omitted, and
  C is an exact token frontier; otherwise R. It follows the message structure of typed R, not
  where a marker lies.
* REC-8: `rewrite_execution_frontiers` (R and the end of the generation header) are where math
  execution must split; moving the recovery position to C or failing a save changes none.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import MediaError, TemplateError
from .identity import FrontierIdentity
from .messages import iter_texts
from .provenance import KIND_CONTENT
from .rendering import Rendering

PROBE_REPLY = {"role": "assistant", "content": "ok"}
PROBE_USER = {"role": "user", "content": "next"}
CONTENT_ROLES = ("user", "system", "developer")


class RewriteKind(str, enum.Enum):
    RESPONSE_REPLAY = "ResponseReplay"  # REC-3
    TURN_CLOSURE = "TurnClosure"        # REC-4


class RecoveryKind(str, enum.Enum):
    C = "C"  # earlier content boundary; closing recomputed after recovery (REC-5, REC-7)
    R = "R"  # the typed rewrite point itself
    P = "P"  # input end with no typed rewrite (REC-6)


@dataclass(frozen=True)
class TypedRewritePoint:
    kind: RewriteKind
    frontier: int
    char_offset: int
    message_index: int  # the message whose end this R is
    identity: FrontierIdentity


@dataclass(frozen=True)
class RecoveryPosition:
    """`recovery_frontier` (REC-5): where the input-side State is really kept."""

    kind: RecoveryKind
    frontier: int
    identity: FrontierIdentity
    rewrite_point: TypedRewritePoint | None
    reason: str = ""


@dataclass(frozen=True)
class RewritePlan:
    response_replay: TypedRewritePoint | None
    turn_closure: TypedRewritePoint | None
    typed_rewrite_point: TypedRewritePoint | None
    recovery_position: RecoveryPosition
    rewrite_execution_frontiers: tuple[int, ...]
    notes: tuple[str, ...] = ()


def _point(r: Rendering, kind: RewriteKind, message_index: int, notes: list[str]) -> TypedRewritePoint | None:
    char, why = r.message_end(message_index)
    if char is None:
        notes.append(f"{kind.value}: {why}")
        return None
    frontier = r.exact_frontier(char)
    if frontier is None or frontier == 0:
        notes.append(f"{kind.value}: message {message_index} does not end on an exact token frontier")
        return None
    return TypedRewritePoint(kind, frontier, char, message_index, r.identity(frontier))


def _probe(r: Rendering, notes: list[str]) -> tuple[str, tuple[int, ...]] | None:
    """Render this conversation + a reply + a next user message (REC-6a)."""
    try:
        text = r.render(list(r.messages) + [PROBE_REPLY, PROBE_USER], add_generation_prompt=True)
    except TemplateError as exc:
        notes.append(f"next-user probe does not render: {exc}")
        return None
    try:
        return text, r.encode(text)
    except MediaError as exc:
        notes.append(f"next-user probe's media placeholders differ: {exc}")
        return None


def _kept_by_probe(r: Rendering, point: TypedRewritePoint, probe: tuple[str, tuple[int, ...]]) -> bool:
    text, ids = probe
    return text[: point.char_offset] == r.text[: point.char_offset] and ids[: point.frontier] == point.identity.tokens


def _content_boundary(r: Rendering, point: TypedRewritePoint) -> tuple[int | None, str]:
    """C for this R, or None and why not (REC-7)."""
    msg = r.messages[point.message_index]
    if msg["role"] not in CONTENT_ROLES:
        return None, f"R follows a {msg['role']} message, not a user/system/developer one"
    prov = r.provenance
    if not prov.proven:
        return None, f"source provenance not proven: {prov.reason}"
    parts = [j for j, text in enumerate(iter_texts(msg.get("content"))) if text]
    if not parts:
        return None, "the message has no content to end at"
    spans = prov.message_spans(point.message_index, KIND_CONTENT)
    if [s.part for s in spans] != parts:
        return None, "part of the message's content is omitted or repeated by the template"
    spans.sort(key=lambda s: s.start)
    if [s.part for s in spans] != parts:
        return None, "the template reorders the message's content"
    c = spans[-1].end
    if c >= point.char_offset:
        return None, "no template closing between the content and R"
    if prov.spans_overlapping(c, point.char_offset):
        return None, "C→R holds source content, not only template closing"
    frontier = r.exact_frontier(c)
    if frontier is None:
        return None, "C is not an exact token frontier"
    if any(m.end > frontier and m.start < point.frontier for m in r.media_ranges):
        return None, "C→R holds an image or video, not only template closing"
    if frontier >= point.frontier:
        return None, "C and R are the same token frontier"
    return frontier, ""


def plan_rewrite(r: Rendering) -> RewritePlan:
    notes: list[str] = []
    n = len(r.messages)
    end = len(r.token_ids)
    rr = tc = None
    if r.add_generation_prompt:
        rr = _point(r, RewriteKind.RESPONSE_REPLAY, n - 1, notes)
        users = [i for i, m in enumerate(r.messages) if m["role"] == "user"]
        if users:
            u = users[-1]
            later = [i for i in range(u + 1, n) if r.messages[i]["role"] == "assistant"]
            tc = _point(r, RewriteKind.TURN_CLOSURE, (later[0] - 1) if later else n - 1, notes)
        else:
            notes.append("TurnClosure: no real user message")
    else:
        notes.append("no generation prompt: no current assistant response, no typed rewrite")
    chosen: TypedRewritePoint | None = None
    if rr is not None or tc is not None:
        probe = _probe(r, notes)
        if probe is None:
            chosen = tc or rr  # without evidence, the shallower typed point
        elif rr is not None and _kept_by_probe(r, rr, probe):
            chosen = rr
        elif tc is not None and _kept_by_probe(r, tc, probe):
            chosen = tc
            notes.append("the next-user probe rewrites the open turn: TurnClosure")
        else:
            notes.append("the next-user probe keeps neither typed rewrite point")
    if chosen is None:
        recovery = RecoveryPosition(RecoveryKind.P, end, r.identity(end), None, "no typed rewrite point")
        return RewritePlan(rr, tc, None, recovery, (end,) if end else (), tuple(notes))
    c, why = _content_boundary(r, chosen)
    if c is not None:
        recovery = RecoveryPosition(RecoveryKind.C, c, r.identity(c), chosen, "C→R is pure template closing")
    else:
        recovery = RecoveryPosition(RecoveryKind.R, chosen.frontier, chosen.identity, chosen, why)
    frontiers = tuple(sorted({chosen.frontier, end}))
    return RewritePlan(rr, tc, chosen, recovery, frontiers, tuple(notes))
