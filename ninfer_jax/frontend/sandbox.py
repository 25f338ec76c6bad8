"""Hugging Face-style chat templates rendered in a sandboxed, immutable Jinja environment.

The environment is `ImmutableSandboxedEnvironment`: templates cannot reach Python internals
(dunder attributes, `str.format` escapes), cannot mutate the messages they are given, and have
no loader, so `include` / `import` / `extends` cannot read the file system. Output is streamed
and cut at a limit, so a hostile template cannot exhaust memory.
"""
from __future__ import annotations

import contextvars
import json
from datetime import datetime
from typing import Any, Callable, Mapping

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import TemplateError

# Default cap on one rendering, in characters (CFG-7: request inputs have their own limits).
DEFAULT_MAX_OUTPUT_CHARS = 8_000_000

# A per-render hook on `tojson` (provenance: which tool definition went where); context-local so
# one shared environment serves concurrent renders.
TojsonHook = Callable[[Any, str], str]
_TOJSON_HOOK: contextvars.ContextVar[TojsonHook | None] = contextvars.ContextVar("tojson_hook", default=None)


class _TemplateRaised(Exception):
    """`raise_exception(...)` called by the template itself."""


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Same output as transformers' chat-template `tojson` (no HTML escaping, unicode kept).
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)
    hook = _TOJSON_HOOK.get()
    return text if hook is None else hook(value, text)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Unsafe attribute access raises instead of quietly rendering as undefined, so a hostile
    template is rejected with a TemplateError rather than half-rendered."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
        loader=None,
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_environment()


class ChatTemplate:
    """One compiled chat template."""

    def __init__(self, source: str, *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS):
        if not isinstance(source, str) or not source:
            raise TemplateError("a chat template must be a non-empty string")
        self.source = source
        self.max_output_chars = max_output_chars
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc

    def render(self, context: Mapping[str, Any], *, tojson_hook: TojsonHook | None = None) -> str:
        """Render with `context` (messages, tools, add_generation_prompt, tokens, kwargs)."""
        token = _TOJSON_HOOK.set(tojson_hook)
        pieces: list[str] = []
        size = 0
        try:
            for piece in self._template.generate(**context):
                size += len(piece)
                if size > self.max_output_chars:
                    raise TemplateError(f"chat template output exceeds {self.max_output_chars} characters")
                pieces.append(piece)
        except TemplateError:
            raise
        except _TemplateRaised as exc:
            raise TemplateError(f"chat template raised: {exc}") from exc
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"chat template broke the sandbox: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        except (RecursionError, MemoryError) as exc:
            raise TemplateError(f"chat template exhausted resources: {type(exc).__name__}") from exc
        except Exception as exc:  # any other error raised while evaluating template code
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        finally:
            _TOJSON_HOOK.reset(token)
        return "".join(pieces)
