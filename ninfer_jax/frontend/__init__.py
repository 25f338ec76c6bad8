"""Frontend: tokenizer, chat templates, typed rewrite points, recovery positions, markers.

It decides every frontier the context cache saves or looks up (spec "Ownership": template
rendering; token/position/media identity; typed rewrite points and the actual input recovery
position; exact boundaries of shared markers). Pure Python: `tokenizers` and sandboxed `jinja2`,
plus numpy and Pillow for image and video input.
"""
from .chat import ChatFrontend, RenderedPrompt, ResponsesPrompt
from .errors import (FrontendError, InputTooLongError, MalformedInputError, MalformedToolCallError, MarkerError,
                     MediaError, MediaNotSupportedError, MediaPlaceholderError, MediaSourceError, MediaTooLargeError,
                     RemoteMediaUnavailableError, TemplateError, TokenizerLoadError, UnknownResponseError,
                     UnknownRoleError, UnsupportedContentError)
from .identity import BLOCK_TOKENS, DigestChain, FrontierIdentity, MediaRange
from .output_parser import ParsedOutput, parse_assistant_output
from .markers import (ContentBoundary, MarkerPolicy, MessageBoundary, RejectedMarker, ResolvedMarker,
                      ToolsBoundary)
from .media_sources import MediaPolicy
from .provenance import Provenance, SourceSpan
from .responses import ResponsesStore, StoredResponse
from .rewrite import RecoveryKind, RecoveryPosition, RewriteKind, TypedRewritePoint
from .sandbox import ChatTemplate
from .tokenizer import BUILTIN_NAME, SpecialToken, Tokenizer

__all__ = [
    "BLOCK_TOKENS", "BUILTIN_NAME", "ChatFrontend", "ChatTemplate", "ContentBoundary", "DigestChain",
    "FrontendError", "FrontierIdentity", "InputTooLongError", "MalformedInputError", "MalformedToolCallError",
    "MarkerError", "MarkerPolicy", "MediaError", "MediaNotSupportedError", "MediaPlaceholderError", "MediaPolicy",
    "MediaRange", "MediaSourceError", "MediaTooLargeError", "MessageBoundary", "ParsedOutput", "parse_assistant_output", "Provenance", "RecoveryKind",
    "RecoveryPosition", "RejectedMarker", "RenderedPrompt", "ResolvedMarker", "ResponsesPrompt",
    "ResponsesStore", "RewriteKind", "SourceSpan", "SpecialToken", "StoredResponse", "TemplateError",
    "Tokenizer", "TokenizerLoadError", "ToolsBoundary", "TypedRewritePoint", "UnknownResponseError", "UnknownRoleError",
    "RemoteMediaUnavailableError", "UnsupportedContentError",
]
