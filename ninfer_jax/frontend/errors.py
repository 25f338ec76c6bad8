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
    """A content part the text-only frontend cannot serialise (images, audio, files ...)."""


class MarkerError(MalformedInputError):
    """Cache markers are malformed, point outside the request, or exceed the limit of four (SH-2)."""


class UnknownResponseError(MalformedInputError):
    """A Responses-style request names a `previous_response_id` the store does not hold (SH-5)."""


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
