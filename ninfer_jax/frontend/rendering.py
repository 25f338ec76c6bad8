"""One chat rendering: text, token ids, proven source spans, message ends and exact frontiers.

Character positions become token frontiers only through a real token-prefix match (SH-7): a
character offset c is the exact frontier k when encoding text[:c] alone gives exactly the first
k token ids of the whole rendering. A message end is proven by rendering the conversation cut
after that message and finding it as a prefix of the full rendering.

With media (a `MediaLayout`), the template's text holds one placeholder token per item; every
proof above runs on that text and its ids (the collapsed ids), and the prompt's ids are the
expansion (frontend/media_prompt.py): a collapsed frontier maps to the expanded one, which never
falls inside an item, and the media ranges enter the digest chain.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from .errors import TemplateError
from .identity import DigestChain, FrontierIdentity, MediaRange
from .media_prompt import Expansion, MediaLayout
from .provenance import Provenance, trace
from .sandbox import ChatTemplate
from .tokenizer import Tokenizer


class Rendering:
    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
                 template_kwargs: Mapping[str, Any] | None = None,
                 check_text: Callable[[str], None] | None = None,
                 check_tokens: Callable[[int], None] | None = None, media: MediaLayout | None = None):
        self.tokenizer = tokenizer
        self.layout = media
        self.template = template
        self.messages = tuple(messages)
        self.tools = list(tools)  # one list object: provenance recognises tools by identity
        self.add_generation_prompt = add_generation_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.text = self.render(self.messages, add_generation_prompt=add_generation_prompt)
        if check_text is not None:
            check_text(self.text)
        self.collapsed_ids: tuple[int, ...] = tuple(tokenizer.encode(self.text))
        self.expansion: Expansion | None = None if media is None else media.expand(self.collapsed_ids)
        self.token_ids: tuple[int, ...] = self.collapsed_ids if self.expansion is None else self.expansion.token_ids
        self.media_ranges: tuple[MediaRange, ...] = () if self.expansion is None else self.expansion.ranges
        if check_tokens is not None:
            check_tokens(len(self.token_ids))
        self.chain = DigestChain(self.token_ids, self.media_ranges)
        self.provenance: Provenance = trace(
            lambda msgs, hook: self.render(msgs, add_generation_prompt=add_generation_prompt, tojson_hook=hook),
            self.messages, self.tools, self.text)
        self._message_end: dict[int, tuple[int | None, str]] = {}
        self._exact: dict[int, int | None] = {}

    # --- rendering ---------------------------------------------------------------------------
    def context(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> dict[str, Any]:
        tok = self.tokenizer
        ctx: dict[str, Any] = dict(self.template_kwargs)
        ctx.update(
            messages=[dict(m) for m in messages],
            tools=self.tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok.bos_token or "",
            eos_token=tok.eos_token or "",
            pad_token=tok.pad_token or "",
        )
        return ctx

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
               tojson_hook: Callable[[Any, str], str] | None = None) -> str:
        return self.template.render(self.context(messages, add_generation_prompt), tojson_hook=tojson_hook)

    def encode(self, text: str) -> tuple[int, ...]:
        """The prompt ids of another rendering of this conversation (the next-user probe): its
        media placeholders expanded like this one's (a `MediaPlaceholderError` if they differ)."""
        ids = tuple(self.tokenizer.encode(text))
        return ids if self.layout is None else self.layout.expand(ids).token_ids

    # --- positions ---------------------------------------------------------------------------
    def message_end(self, index: int) -> tuple[int | None, str]:
        """Character offset where message `index` ends (its template closing included), proven
        by a prefix rendering; None and a reason when the template does not allow the proof."""
        if index not in self._message_end:
            try:
                prefix = self.render(self.messages[: index + 1], add_generation_prompt=False)
            except TemplateError as exc:
                self._message_end[index] = (None, f"the conversation cut after message {index} does not render: {exc}")
            else:
                if self.text.startswith(prefix):
                    self._message_end[index] = (len(prefix), "")
                else:
                    self._message_end[index] = (
                        None, f"the rendering of messages[:{index + 1}] is not a prefix of the full rendering")
        return self._message_end[index]

    def exact_frontier(self, char: int) -> int | None:
        """Token frontier k of character offset `char`, only after a real token-prefix match.

        With media the match runs on the collapsed ids and k is mapped to the prompt's ids. A
        frontier strictly inside a media range is dropped (None, so the marker or rewrite point
        is rejected with a reason), not moved to the range's end: a moved save point would name
        a prefix the caller did not mark. The mapping never lands inside an item (a collapsed
        frontier is before or after a whole placeholder), so this is a guard only."""
        if char not in self._exact:
            result: int | None = None
            if 0 <= char <= len(self.text):
                prefix = self.tokenizer.encode(self.text[:char])
                k = len(prefix)
                if tuple(prefix) == self.collapsed_ids[:k]:
                    k = k if self.expansion is None else self.expansion.frontier(k)
                    if not self.chain.splits_media(k):
                        result = k
            self._exact[char] = result
        return self._exact[char]

    def media_end(self, message: int, part: int) -> int | None:
        """The frontier right after the media item at `messages[message].content[part]`, if any."""
        return None if self.expansion is None else self.expansion.end_of(message, part)

    def identity(self, frontier: int) -> FrontierIdentity:
        return self.chain.identity(frontier)
