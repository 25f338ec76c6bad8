"""Typed errors of the frontend (doctrine 3 of docs/rules.md: bad input gets a typed error at the boundary).

Every error the frontend raises on purpose is a `FrontendError`, so a server can map the whole
family to one "invalid request" status while tests check the exact subclass.
"""
from __future__ import annotations


class FrontendError(ValueError):
    """Base of every error the frontend raises for bad input or a bad asset."""


class TokenizerLoadError(FrontendError):
    """A tokenizer folder is missing files or holds something that does not parse."""


class MalformedInputError(FrontendError):
    """A request is structurally wrong: a message is not a mapping, content is not text, ..."""


class UnknownRoleError(MalformedInputError):
    """A message names a role the frontend does not know."""


class MalformedToolCallError(MalformedInputError):
    """A tool call, a tool definition or a tool message does not follow the expected shape."""


class UnsupportedContentError(MalformedInputError):
    """A content part the frontend cannot serialise (audio, files ...), or an image or video for a
    model without vision tokens (`MediaNotSupportedError`)."""


class MarkerError(MalformedInputError):
    """Cache markers are malformed, point outside the request, or exceed the limit of four (SH-2)."""


class UnknownResponseError(MalformedInputError):
    """A Responses-style request names a `previous_response_id` the store does not hold (SH-5)."""


class EvictedResponseError(UnknownResponseError):
    """A stored response was evicted for the store's budget (its count or bytes, least recently
    used first), or was never stored because it alone exceeds the byte budget (CFG-7): a caller
    that chains onto it learns why it is gone, not just that it is."""


class ExpiredResponseError(UnknownResponseError):
    """A stored response outlived the store's expiry (seconds since it was stored)."""


class TemplateError(FrontendError):
    """A chat template does not compile, raises, overruns its output limit or breaks the sandbox."""


class InputTooLongError(FrontendError):
    """The rendered input is longer than the configured limit (CFG-1, CFG-7)."""

    def __init__(self, message: str, *, length: int, limit: int):
        super().__init__(message)
        self.length = length
        self.limit = limit


class MediaError(FrontendError):
    """An image or video the vision preprocessing cannot take (frontend/media.py); `code` names
    the reason with a stable string, so a server can report it without parsing the message."""

    code = "media"

    def __init__(self, message: str):
        super().__init__(f"{self.code}: {message}")


class UndecodableMediaError(MediaError):
    """Bytes that are not an image Pillow can identify, or a truncated or corrupt file."""

    code = "undecodable_image"


class UnsupportedMediaError(MediaError):
    """A decodable input of a kind the preprocessing does not take: a file format outside the
    allowed list, an array of the wrong dtype or shape, an empty image, frames of unequal size,
    an aspect ratio over 200, too few frames for one temporal patch."""

    code = "unsupported_media"


class TooManyPixelsError(MediaError):
    """An image (or video frame) larger than the caller's `max_input_pixels`, found from the file
    header before anything is decoded."""

    code = "too_many_pixels"

    def __init__(self, message: str, *, pixels: int, limit: int):
        super().__init__(message)
        self.pixels = pixels
        self.limit = limit


class TooManyFramesError(MediaError):
    """A video with more frames than the caller's limit (or, unsampled, than `max_frames`)."""

    code = "too_many_frames"

    def __init__(self, message: str, *, frames: int, limit: int):
        super().__init__(message)
        self.frames = frames
        self.limit = limit


class MediaSourceError(MediaError):
    """A media source the policy refuses or that does not parse (frontend/media_sources.py): a
    bad `data:` URL, a `file://` URL outside the allowed folder (or with none configured), an
    http(s) URL without permission, an unknown scheme."""

    code = "media_source"


class MediaTooLargeError(MediaSourceError):
    """A media source over the policy's `max_bytes`, found before it is read whole."""

    code = "media_too_large"

    def __init__(self, message: str, *, size: int, limit: int):
        super().__init__(message)
        self.size = size
        self.limit = limit


class RemoteMediaUnavailableError(MediaSourceError):
    """An http(s) media URL the policy allows could not be fetched (unreachable, an HTTP error, a
    timeout, a body that is not an image)."""

    code = "remote_media_unavailable"


class MediaNotSupportedError(MediaError, UnsupportedContentError):
    """Media given to a model whose tokenizer lacks the vision tokens (`<|vision_start|>`,
    `<|image_pad|>`, ...): found before any media is read or the template renders."""

    code = "media_not_supported"


class MediaPlaceholderError(MediaError):
    """The rendered prompt's media placeholders do not match the request's media: the template
    dropped or repeated an item, a text part wrote a placeholder token, or a placeholder does not
    follow `<|vision_start|>`."""

    code = "media_placeholder"
