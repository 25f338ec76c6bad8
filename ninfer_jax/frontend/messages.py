"""Validation and normalisation of chat messages and tool definitions.

Turns caller input (OpenAI-style chat messages, content parts, tool calls) into plain,
template-ready dicts, and pulls the caller's `cache_control` hints out as explicit markers.
Tool-call arguments are parsed into JSON objects, so a tool call renders the same whatever
spacing the client used for its argument string (a normalised history rewrite, REC-3).

Image and video parts (OpenAI `image_url`, Responses `input_image`, `image`, `video_url`,
`video` with frames) become the template-ready `{"type": "image"}` / `{"type": "video"}` dicts a
Qwen chat template renders as its vision placeholders; where their bytes come from is kept apart,
in order, as `MediaPart`s (resolved later, under a policy, by frontend/media_sources.py).
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .errors import MalformedInputError, MalformedToolCallError, UnknownRoleError, UnsupportedContentError
from .markers import ContentBoundary, MarkerSpec, MessageBoundary, ToolsBoundary
from .media_sources import MediaPart

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT_PART_TYPES = ("text", "input_text", "output_text")
IMAGE_PART_TYPES = ("image_url", "input_image", "image")
VIDEO_PART_TYPES = ("video_url", "video")
MEDIA_TYPES = ("image", "video")  # the template-ready part types
_CONTENT_ROLES_REQUIRED = ("system", "developer", "user", "tool")


@dataclass(frozen=True)
class Conversation:
    """Normalised input of one chat request."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...]
    markers: tuple[MarkerSpec, ...]   # from `cache_control` hints, in source order
    media: tuple[MediaPart, ...] = ()  # image and video parts, in source order

    def content_parts(self) -> list[int]:
        """How many addressable parts each message has (a string counts as one)."""
        return [count_parts(m.get("content")) for m in self.messages]


def count_parts(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return 1
    return len(content)


def iter_texts(content: Any) -> list[str]:
    """The text of each part; an image or video part has none ("")."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [part.get("text", "") for part in content]


def _json_like(value: Any, where: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise MalformedInputError(f"{where}: not JSON-serialisable ({exc})") from exc


def _source(value: Any, where: str) -> str | bytes:
    """A URL string (also OpenAI's `{"url": ...}` form) or raw bytes."""
    if isinstance(value, Mapping):
        value = value.get("url")
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value):
        return bytes(value)
    if isinstance(value, str) and value:
        return value
    raise MalformedInputError(f"{where}: needs a non-empty URL string or bytes, got {type(value).__name__}")


def _fps(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MalformedInputError(f"{where}: fps must be a positive number, got {value!r}")
    return float(value)


def _media_part(part: Mapping[str, Any], kind: str, where: str, message: int, j: int) -> MediaPart:
    where = f"{where}: {kind} part {j}"
    if kind in ("image_url", "input_image"):
        if part.get("image_url") is None and part.get("file_id") is not None:
            raise UnsupportedContentError(f"{where}: an image by file_id is not supported (give image_url)")
        return MediaPart("image", message, j, _source(part.get("image_url"), where))
    if kind == "image":
        return MediaPart("image", message, j, _source(part.get("image", part.get("url")), where))
    fps = _fps(part.get("fps"), where)
    value = part.get("video_url") if kind == "video_url" else part.get("video", part.get("url"))
    if kind == "video" and isinstance(value, (list, tuple)):
        frames = value
        if frames and all(isinstance(f, (list, tuple)) for f in frames):  # transformers' nested [[frame, ...]]
            if len(frames) != 1:
                raise MalformedInputError(f"{where}: a nested frame list holds one video, got {len(frames)} lists")
            frames = frames[0]
        if not frames:
            raise MalformedInputError(f"{where}: a video needs at least one frame")
        return MediaPart("video", message, j, None, tuple(_source(f, f"{where} frame {k}") for k, f in enumerate(frames)),
                         fps)
    return MediaPart("video", message, j, _source(value, where), fps=fps)


def _content(raw: Any, where: str, markers: list[MarkerSpec], index: int, media: list[MediaPart]) -> Any:
    """String content stays a string; a list becomes [{"type": "text", "text": ...}, ...], with
    each image or video part as {"type": "image"} / {"type": "video"} (its source to `media`)."""
    if raw is None or isinstance(raw, str):
        return raw
    if not isinstance(raw, (list, tuple)):
        raise MalformedInputError(f"{where}: content must be a string, a list of parts or null")
    parts = []
    for j, part in enumerate(raw):
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, Mapping):
            raise MalformedInputError(f"{where}: content part {j} is not a mapping")
        kind = part.get("type", "text")
        if kind in IMAGE_PART_TYPES or kind in VIDEO_PART_TYPES:
            item = _media_part(part, kind, where, index, j)
            media.append(item)
            if part.get("cache_control") is not None:
                markers.append(ContentBoundary(index, j))
            parts.append({"type": item.kind})
            continue
        if kind not in TEXT_PART_TYPES:
            raise UnsupportedContentError(f"{where}: content part type {kind!r} is not supported "
                                          "(text, image and video only)")
        text = part.get("text")
        if not isinstance(text, str):
            raise MalformedInputError(f"{where}: text part {j} has no string 'text'")
        if part.get("cache_control") is not None:
            markers.append(ContentBoundary(index, j))
        parts.append({"type": "text", "text": text})
    return parts


def _arguments(raw: Any, where: str) -> dict:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise MalformedToolCallError(f"{where}: arguments are not valid JSON ({exc.msg})") from exc
        except RecursionError:  # nested past the parser's limit (inside a string, the body's own check misses it)
            raise MalformedToolCallError(f"{where}: arguments nest too deep") from None
    if not isinstance(raw, Mapping):
        raise MalformedToolCallError(f"{where}: arguments must be a JSON object")
    return _json_like(dict(raw), where)


def _tool_call(raw: Any, where: str) -> dict:
    if not isinstance(raw, Mapping):
        raise MalformedToolCallError(f"{where}: a tool call must be a mapping")
    if raw.get("type", "function") != "function":
        raise MalformedToolCallError(f"{where}: tool call type {raw.get('type')!r} is not 'function'")
    fn = raw.get("function", raw)
    if not isinstance(fn, Mapping):
        raise MalformedToolCallError(f"{where}: 'function' must be a mapping")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedToolCallError(f"{where}: a tool call needs a non-empty string name")
    if "arguments" not in fn:
        raise MalformedToolCallError(f"{where}: a tool call needs arguments")
    call: dict = {"type": "function", "function": {"name": name, "arguments": _arguments(fn["arguments"], where)}}
    call_id = raw.get("id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise MalformedToolCallError(f"{where}: tool call id must be a string")
        call["id"] = call_id
    return call


def normalize_tools(tools: Sequence[Any] | None, markers: list[MarkerSpec]) -> tuple[dict, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise MalformedToolCallError("tools must be a list")
    out = []
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, Mapping):
            raise MalformedToolCallError(f"{where}: a tool definition must be a mapping")
        tool = dict(tool)
        if tool.pop("cache_control", None) is not None:
            markers.append(ToolsBoundary(k))
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise MalformedToolCallError(f"{where}: a tool definition needs a function name")
        out.append(_json_like(tool, where))
    return tuple(out)


def normalize_messages(messages: Sequence[Any], tools: Sequence[Any] | None = None) -> Conversation:
    """Validate roles, content, tool calls and tool messages; collect `cache_control` markers."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise MalformedInputError("messages must be a list")
    if not messages:
        raise MalformedInputError("messages must not be empty")
    markers: list[MarkerSpec] = []
    media: list[MediaPart] = []
    out: list[dict] = []
    open_calls: set[str] | None = None  # ids of the tool calls the current tool messages answer
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(raw, Mapping):
            raise MalformedInputError(f"{where}: a message must be a mapping")
        role = raw.get("role")
        if role not in ROLES:
            raise UnknownRoleError(f"{where}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
        msg: dict = {k: copy.deepcopy(v) for k, v in raw.items()
                     if k not in ("role", "content", "cache_control", "tool_calls", "reasoning_content")}
        msg = _json_like(msg, where)
        msg["role"] = role
        msg["content"] = _content(raw.get("content"), where, markers, i, media)
        if raw.get("cache_control") is not None:
            markers.append(MessageBoundary(i))
        if role in _CONTENT_ROLES_REQUIRED and msg["content"] is None:
            raise MalformedInputError(f"{where}: a {role} message needs content")
        if role == "assistant":
            reasoning = raw.get("reasoning_content")
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise MalformedInputError(f"{where}: reasoning_content must be a string")
                msg["reasoning_content"] = reasoning
            calls = raw.get("tool_calls")
            if calls:
                if not isinstance(calls, (list, tuple)):
                    raise MalformedToolCallError(f"{where}: tool_calls must be a list")
                msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
                open_calls = {c["id"] for c in msg["tool_calls"] if "id" in c}
            else:
                open_calls = None
                if msg["content"] is None:
                    raise MalformedInputError(f"{where}: an assistant message needs content or tool calls")
        elif role == "tool":
            if open_calls is None:
                raise MalformedToolCallError(f"{where}: a tool message must follow an assistant tool call")
            call_id = raw.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise MalformedToolCallError(f"{where}: tool_call_id must be a string, got {type(call_id).__name__}")
            if call_id is not None and open_calls and call_id not in open_calls:
                raise MalformedToolCallError(f"{where}: tool_call_id {call_id!r} answers no preceding tool call")
        else:
            for key in ("tool_calls", "reasoning_content"):
                if raw.get(key):
                    raise MalformedInputError(f"{where}: a {role} message cannot carry {key}")
            open_calls = None
        out.append(msg)
    return Conversation(tuple(out), normalize_tools(tools, markers), tuple(markers), tuple(media))
