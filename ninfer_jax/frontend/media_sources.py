"""Where an image's (or a video frame's) bytes come from, under a `MediaPolicy`.

A chat message names its media by URL (or, from Python, by raw bytes); `resolve_source` turns
one such source into bytes, or refuses it with a typed `MediaSourceError` before anything is read:

* `data:<mime>;base64,<data>`: the mime type must be `image/...` (a video file: or `video/...`);
  the encoded length is checked
  against `max_bytes` before decoding, and the data must be strict base64 (whitespace aside);
* `file:///path`: only with `allowed_local_media_path` set, and only for a regular file inside
  that folder once every symlink and `..` is resolved (the folder itself resolved too); the file
  is opened by its resolved path without following a last-moment symlink, and read up to
  `max_bytes`;
* raw bytes (Python callers): taken as they are, up to `max_bytes`;
* `http://`, `https://`: refused unless `allow_remote_urls`; then fetched (`_fetch`) with
  `max_bytes` and `fetch_timeout_s`, an image (or video) content type required; a failure is a
  `RemoteMediaUnavailableError`. Without the permission no network connection is ever opened;
* anything else (a bare path, another scheme): refused.

Decoding the bytes into pixels is frontend/media.py's job (`prepare_image`), which checks the
image's size against `max_input_pixels` from its header; the policy carries that limit and
`max_input_frames` so one object says what a request may bring. `MediaPart` (made by
frontend/messages.py) is the unresolved reference to one part's source.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError
from .errors import MediaSourceError, MediaTooLargeError, RemoteMediaUnavailableError
from .media import MAX_INPUT_PIXELS

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<data>.*)$", re.S)
_WHITESPACE = re.compile(rb"\s+")


@dataclass(frozen=True)
class MediaPart:
    """Where one image or video part sits (`messages[message].content[part]`) and where its bytes
    come from: `source` (a URL string or raw bytes), or for a video given as frames, `frames` in
    order (`source` None), taken at `fps` frames per second when the caller says so."""

    kind: str                                     # "image" | "video"
    message: int
    part: int
    source: str | bytes | None = field(default=None, repr=False)
    frames: tuple[str | bytes, ...] = field(default=(), repr=False)
    fps: float | None = None


@dataclass(frozen=True)
class MediaPolicy:
    """What media a request may bring, and from where.

    `allowed_local_media_path`: the folder `file://` URLs may read from (None: no local files);
    `allow_remote_urls`: whether http(s) URLs are fetched at all (`fetch_timeout_s` each);
    `max_bytes`: the most bytes one source (an image, a video frame) may hold;
    `max_input_pixels`: the most pixels of one image or frame, read from its header;
    `max_input_frames`: the most frames of one video (None: the processor's `max_frames`);
    `enabled`: False where whoever serves the rendered prompt cannot run media (a text-only
    checkpoint, say), so media is refused before any of it is read; `why` says why."""

    allowed_local_media_path: str | None = None
    allow_remote_urls: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    max_input_pixels: int = MAX_INPUT_PIXELS
    max_input_frames: int | None = None
    enabled: bool = True
    why: str = ""
    fetch_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_input_pixels", "max_input_frames"):
            value = getattr(self, name)
            if value is None and name == "max_input_frames":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        t = self.fetch_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ConfigError("fetch_timeout_s", f"must be a positive number of seconds, got {t!r}")
        folder = self.allowed_local_media_path
        if folder is not None and (not isinstance(folder, (str, os.PathLike)) or not str(folder)):
            raise ConfigError("allowed_local_media_path", f"must be a folder path or None, got {folder!r}")


def _describe(source: str) -> str:
    return source if len(source) <= 80 else source[:77] + "..."


def resolve_source(source: str | bytes, policy: MediaPolicy, video: bool = False) -> bytes:
    """The bytes of one image (or video frame) source; `video`: a video file, whose data URL
    may also be of a `video/...` type. See the module docstring."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        _check_size(len(data), policy, "raw media bytes")
        return data
    if not isinstance(source, str):
        raise MediaSourceError(f"a media source is a URL string or bytes, got {type(source).__name__}")
    scheme = source.split(":", 1)[0].lower() if ":" in source else ""
    if scheme == "data":
        return _data_url(source, policy, video)
    if scheme == "file":
        return _file_url(source, policy)
    if scheme in ("http", "https"):
        if not policy.allow_remote_urls:
            raise MediaSourceError(f"remote media URLs are not allowed: {_describe(source)}")
        return _fetch(source, policy, video)
    raise MediaSourceError(f"unsupported media source {_describe(source)!r} (give a data: or file:// URL)")


def _fetch(url: str, policy: MediaPolicy, video: bool) -> bytes:
    """GET an http(s) URL the policy allows: at most `max_bytes` read (a larger body, declared
    or not, is refused without reading the rest), `fetch_timeout_s` for the connection and each
    read, no redirect to another scheme, an `image/...` (or, for a video, `video/...`) body.
    Any failure to fetch is a `RemoteMediaUnavailableError` naming why."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"User-Agent": "ninfer-jax"})
    try:
        with urllib.request.urlopen(request, timeout=policy.fetch_timeout_s) as response:  # noqa: S310 (http(s) only)
            final = response.geturl()
            if final.split(":", 1)[0].lower() not in ("http", "https"):
                raise RemoteMediaUnavailableError(f"{_describe(url)} redirected to a non-http URL")
            mime = (response.headers.get_content_type() or "").lower()
            if not (mime.startswith("image/") or (video and mime.startswith("video/"))
                    or mime == "application/octet-stream"):
                raise RemoteMediaUnavailableError(f"{_describe(url)} answered with content type {mime!r}, "
                                                  f"expected image/..." + (" or video/..." if video else ""))
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit():
                _check_size(int(declared), policy, _describe(url))
            data = response.read(policy.max_bytes + 1)
    except MediaSourceError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as e:  # refused, unreachable, HTTP error, timeout
        reason = getattr(e, "reason", None) or e
        raise RemoteMediaUnavailableError(f"could not fetch {_describe(url)}: {reason}") from None
    _check_size(len(data), policy, _describe(url))
    if not data:
        raise RemoteMediaUnavailableError(f"{_describe(url)} answered with an empty body")
    return data


def _check_size(size: int, policy: MediaPolicy, what: str) -> None:
    if size > policy.max_bytes:
        raise MediaTooLargeError(f"{what}: {size} bytes over the limit of {policy.max_bytes}",
                                 size=size, limit=policy.max_bytes)


def _data_url(url: str, policy: MediaPolicy, video: bool = False) -> bytes:
    match = _DATA_URL.match(url)
    if match is None:
        raise MediaSourceError("a data URL needs the form data:<mime>;base64,<data>")
    mime = match.group("mime").strip().lower()
    params = [p.strip().lower() for p in match.group("params").split(";") if p.strip()]
    if not (mime.startswith("image/") or (video and mime.startswith("video/"))):
        raise MediaSourceError(f"a data URL of mime type {mime or '(none)'!r}, expected "
                               + ("image/... or video/..." if video else "image/..."))
    if "base64" not in params:
        raise MediaSourceError("a data URL must be base64-encoded (;base64,)")
    encoded = _WHITESPACE.sub(b"", match.group("data").encode("ascii", "replace"))
    _check_size(len(encoded) // 4 * 3, policy, "data URL")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaSourceError(f"a data URL whose data is not valid base64: {e}") from e
    if not data:
        raise MediaSourceError("a data URL with no data")
    _check_size(len(data), policy, "data URL")
    return data


def _file_url(url: str, policy: MediaPolicy) -> bytes:
    if policy.allowed_local_media_path is None:
        raise MediaSourceError("file:// media URLs are not allowed (no allowed_local_media_path is configured)")
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise MediaSourceError(f"a file URL is file:///absolute/path, got {_describe(url)!r}")
    raw = unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise MediaSourceError(f"a file URL is file:///absolute/path, got {_describe(url)!r}")
    try:
        folder = Path(policy.allowed_local_media_path).resolve(strict=True)
        path = Path(raw).resolve(strict=True)   # every symlink and `..` resolved
    except (OSError, RuntimeError) as e:
        raise MediaSourceError(f"media file not found: {_describe(url)!r} ({type(e).__name__})") from e
    if path != folder and folder not in path.parents:
        raise MediaSourceError(f"media file outside the allowed folder: {_describe(url)!r}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise MediaSourceError(f"media file cannot be opened: {_describe(url)!r} ({e.strerror})") from e
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise MediaSourceError(f"media path is not a regular file: {_describe(url)!r}")
        _check_size(info.st_size, policy, "media file")
        data = f.read(policy.max_bytes + 1)
    _check_size(len(data), policy, "media file")
    if not data:
        raise MediaSourceError(f"media file is empty: {_describe(url)!r}")
    return data
