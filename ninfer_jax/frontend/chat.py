"""The frontend facade: render a request and hand the engine every frontier the cache needs.

`ChatFrontend.render_chat` (OpenAI-style messages), `render_responses` (Responses-style input
over a `ResponsesStore`) and `prepare_prompt` (raw text or token ids) all return a
`RenderedPrompt`: token ids, the typed rewrite points and the chosen input recovery position
(REC-3..8), `rewrite_execution_frontiers` kept apart, resolved cache markers (SH-2..7), and for
every frontier its `FrontierIdentity` (CKP-1, CKP-4). With image or video parts, every item is
checked, read (under the `MediaPolicy`) and prepared before the template renders; the prompt
then carries the prepared items and their `MediaRange`s (frontend/media_prompt.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .errors import InputTooLongError, MalformedInputError, MediaNotSupportedError, TemplateError
from .identity import DigestChain, FrontierIdentity, MediaRange
from .markers import (MarkerPlan, MarkerPolicy, MarkerSpec, RejectedMarker, ResolvedMarker, automatic_candidates,
                      normalize_specs, parse_marker, resolve_markers)
from .media import PreparedImage, ProcessorSettings
from .media_prompt import PAD_TOKENS, VISION_END, VISION_START, Expansion, MediaLayout
from .media_sources import MediaPart, MediaPolicy
from .messages import Conversation, iter_texts, normalize_messages
from .provenance import Provenance
from .rendering import Rendering
from .responses import ResponsesStore, input_items, items_to_messages, strip_cache_control
from .rewrite import RecoveryKind, RecoveryPosition, TypedRewritePoint, plan_rewrite
from .sandbox import DEFAULT_MAX_OUTPUT_CHARS, ChatTemplate
from .tokenizer import BUILTIN_NAME, Tokenizer

_RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "pad_token"})


@dataclass(frozen=True)
class RenderedPrompt:
    """One request's input and every frontier the cache will save or look up."""

    token_ids: tuple[int, ...] = field(repr=False)
    text: str | None = field(repr=False)
    recovery_position: RecoveryPosition
    rewrite_execution_frontiers: tuple[int, ...]
    typed_rewrite_point: TypedRewritePoint | None = None
    response_replay: TypedRewritePoint | None = None
    turn_closure: TypedRewritePoint | None = None
    markers: tuple[ResolvedMarker, ...] = ()
    rejected_markers: tuple[RejectedMarker, ...] = ()
    automatic_markers_yielded: tuple[MarkerSpec, ...] = ()
    messages: tuple[dict, ...] = field(default=(), repr=False)
    tools: tuple[dict, ...] = field(default=(), repr=False)
    provenance: Provenance | None = field(default=None, repr=False)
    notes: tuple[str, ...] = field(default=(), repr=False)
    chain: DigestChain | None = field(default=None, repr=False, compare=False)
    # images and videos in prompt order, and the tokens each stands for (parallel tuples)
    media: tuple[PreparedImage, ...] = field(default=(), repr=False, compare=False)
    media_ranges: tuple[MediaRange, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)

    def identity(self, frontier: int) -> FrontierIdentity:
        chain = self.chain if self.chain is not None else DigestChain(self.token_ids, self.media_ranges)
        return chain.identity(frontier)

    @property
    def save_opportunities(self) -> tuple[int, ...]:
        """Frontiers the Frontend offers for saves (SAVE-1): the recovery position and markers."""
        return tuple(sorted({self.recovery_position.frontier, *(m.frontier for m in self.markers)}))


@dataclass(frozen=True)
class ResponsesPrompt:
    """A rendered Responses request plus the raw input to store once the response exists."""

    prompt: RenderedPrompt
    raw_input: tuple[dict, ...]
    previous_response_id: str | None
    dropped_messages: int = 0  # the oldest messages `truncation="auto"` left out to fit


class ChatFrontend:
    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None, *,
                 max_input_tokens: int | None = None, max_input_chars: int | None = None,
                 max_template_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
                 media_policy: MediaPolicy | None = None, image_settings: ProcessorSettings | None = None,
                 video_settings: ProcessorSettings | None = None, media_folder: str | None = None):
        """`media_policy` says where media may come from (default: data URLs and bytes only);
        the processor settings default to `media_folder`'s preprocessor configs, read on the
        first media request, else to the released Qwen3.5 values."""
        self.tokenizer = tokenizer
        source = chat_template if chat_template is not None else tokenizer.chat_template
        self.template = None if source is None else ChatTemplate(source, max_output_chars=max_template_output_chars)
        self.max_input_tokens = max_input_tokens
        self.max_input_chars = max_input_chars
        self.media_policy = media_policy or MediaPolicy()
        self._image_settings = image_settings
        self._video_settings = video_settings
        self._media_folder = media_folder

    @classmethod
    def builtin(cls, **limits: Any) -> "ChatFrontend":
        return cls(Tokenizer.builtin(), **limits)

    @classmethod
    def load(cls, model: str, **limits: Any) -> "ChatFrontend":
        """`builtin:tiny-hybrid` or a model / tokenizer folder."""
        if str(model) != BUILTIN_NAME:
            limits.setdefault("media_folder", str(model))
        return cls(Tokenizer.load(model), **limits)

    def _media_layout(self, conv: Conversation) -> MediaLayout | None:
        """Check, read and prepare the request's media before anything renders (None: none)."""
        if not conv.media:
            return None
        return self._prepare_media(conv.media)

    def expand_prompt(self, text: str, images: Sequence[str | bytes]) -> Expansion:
        """A raw text prompt with images (bytes or URLs under the media policy): one
        `<|vision_start|><|image_pad|><|vision_end|>` per image where the text writes them, else
        all of them before the text; each placeholder expanded to its image's tokens."""
        parts = tuple(MediaPart("image", 0, i, source) for i, source in enumerate(images))
        layout = self._prepare_media(parts)
        if PAD_TOKENS["image"] not in text:
            text = (VISION_START + PAD_TOKENS["image"] + VISION_END) * len(parts) + text
        self._check_chars(len(text))
        expansion = layout.expand(self.tokenizer.encode(text))
        self._check_tokens(len(expansion.token_ids))
        return expansion

    def _prepare_media(self, parts) -> MediaLayout:
        if not self.media_policy.enabled:
            raise MediaNotSupportedError(self.media_policy.why or "image and video input is not served here")
        if self._image_settings is None or self._video_settings is None:
            folder = self._media_folder
            if self._image_settings is None:
                self._image_settings = (ProcessorSettings.from_folder(folder) if folder else ProcessorSettings())
            if self._video_settings is None:
                self._video_settings = (ProcessorSettings.from_folder(folder, video=True) if folder
                                        else ProcessorSettings.video_defaults())
        return MediaLayout.prepare(parts, self.tokenizer, self.media_policy, self._image_settings,
                                   self._video_settings)

    # --- limits (CFG-1, CFG-7) ---------------------------------------------------------------
    def _check_chars(self, n: int) -> None:
        if self.max_input_chars is not None and n > self.max_input_chars:
            raise InputTooLongError(f"input has {n} characters, the limit is {self.max_input_chars}",
                                    length=n, limit=self.max_input_chars)

    def _check_tokens(self, n: int) -> None:
        if self.max_input_tokens is not None and n > self.max_input_tokens:
            raise InputTooLongError(f"input has {n} tokens, the limit is {self.max_input_tokens}",
                                    length=n, limit=self.max_input_tokens)

    # --- chat --------------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
                    cache_markers: Sequence[Any] | None = None,
                    marker_policy: MarkerPolicy | str = MarkerPolicy.OPENAI_DEFAULT,
                    add_generation_prompt: bool = True,
                    template_kwargs: Mapping[str, Any] | None = None) -> RenderedPrompt:
        if self.template is None:
            raise TemplateError(f"tokenizer {self.tokenizer.name!r} has no chat template")
        policy = MarkerPolicy(marker_policy)
        kwargs = dict(template_kwargs or {})
        if _RESERVED_KWARGS & set(kwargs):
            raise MalformedInputError(f"template_kwargs may not set {sorted(_RESERVED_KWARGS & set(kwargs))}")
        conv = normalize_messages(messages, tools)
        self._check_chars(sum(len(t) for m in conv.messages for t in iter_texts(m.get("content"))))
        caller = [parse_marker(m) for m in (cache_markers or ())]
        parts = conv.content_parts()
        explicit = normalize_specs(list(conv.markers) + caller, len(conv.messages), len(conv.tools), parts)
        layout = self._media_layout(conv)
        rendering = Rendering(self.tokenizer, self.template, conv.messages, conv.tools,
                              add_generation_prompt=add_generation_prompt, template_kwargs=kwargs,
                              check_text=lambda text: self._check_chars(len(text)),
                              check_tokens=self._check_tokens, media=layout)
        plan = plan_rewrite(rendering)
        auto = automatic_candidates(policy, conv.messages, len(conv.tools))
        marker_plan: MarkerPlan = resolve_markers(rendering, explicit, auto)
        return RenderedPrompt(
            token_ids=rendering.token_ids,
            text=rendering.text,
            recovery_position=plan.recovery_position,
            rewrite_execution_frontiers=plan.rewrite_execution_frontiers,
            typed_rewrite_point=plan.typed_rewrite_point,
            response_replay=plan.response_replay,
            turn_closure=plan.turn_closure,
            markers=marker_plan.markers,
            rejected_markers=marker_plan.rejected,
            automatic_markers_yielded=marker_plan.automatic_yielded,
            messages=conv.messages,
            tools=conv.tools,
            provenance=rendering.provenance,
            notes=plan.notes,
            chain=rendering.chain,
            media=() if rendering.expansion is None else tuple(m.prepared for m in rendering.expansion.media),
            media_ranges=rendering.media_ranges,
        )

    # --- Responses (SH-5) --------------------------------------------------------------------
    def render_responses(self, input: str | Sequence[Mapping[str, Any]], *, store: ResponsesStore,
                         previous_response_id: str | None = None, instructions: str | None = None,
                         tools: Sequence[Mapping[str, Any]] | None = None, cache_markers: Sequence[Any] | None = None,
                         marker_policy: MarkerPolicy | str = MarkerPolicy.OPENAI_DEFAULT,
                         template_kwargs: Mapping[str, Any] | None = None,
                         truncation: str = "disabled") -> ResponsesPrompt:
        """Expand the stored history, normalise this input, then apply the marker policy.

        `cache_markers` index the expanded, normalised messages (instructions first, if any; after
        truncation, the messages kept). `truncation="auto"`: a conversation over the input limit
        drops its oldest turns (each from a user message to the next), keeping the instructions
        and the newest turn, the fewest that make it fit; "disabled": InputTooLongError.
        """
        if truncation not in ("auto", "disabled"):
            raise MalformedInputError(f"truncation must be 'auto' or 'disabled', got {truncation!r}")
        raw = input_items(input)
        history = strip_cache_control(store.history(previous_response_id)) if previous_response_id else []
        messages = items_to_messages(history + raw)
        head = []
        if instructions is not None:
            if not isinstance(instructions, str):
                raise MalformedInputError("instructions must be a string")
            # Leading instructions are a system message: every chat template knows that role.
            head = [{"role": "system", "content": instructions}]

        def render(dropped: int) -> RenderedPrompt:
            return self.render_chat(head + messages[dropped:], tools=tools, cache_markers=cache_markers,
                                    marker_policy=marker_policy, template_kwargs=template_kwargs)

        try:
            return ResponsesPrompt(render(0), tuple(raw), previous_response_id)
        except InputTooLongError as exc:
            if truncation != "auto":
                raise
            last = exc
        # the turns' starts; the last turn stays. Fewer messages never render longer, so the
        # fewest turns to drop are found by bisection over the turns' starts.
        starts = [k for k, m in enumerate(messages) if k and m.get("role") == "user"]
        lo, hi, best = 0, len(starts) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            try:
                best = (starts[mid], render(starts[mid]))
                hi = mid - 1
            except InputTooLongError as exc:
                last, lo = exc, mid + 1
        if best is None:
            raise InputTooLongError(f"{last} even with only the instructions and the newest turn",
                                    length=last.length, limit=last.limit)
        return ResponsesPrompt(best[1], tuple(raw), previous_response_id, best[0])

    # --- raw prompts (REC-6: P) --------------------------------------------------------------
    def prepare_prompt(self, prompt: str | Sequence[int]) -> RenderedPrompt:
        """A raw text or token prompt: no template, no typed rewrite; the recovery position is P."""
        if isinstance(prompt, str):
            self._check_chars(len(prompt))
            ids = tuple(self.tokenizer.encode(prompt, add_special_tokens=True))
            text: str | None = prompt
        else:
            if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
                raise MalformedInputError("a prompt is a string or a sequence of token ids")
            vocab = self.tokenizer.vocab_size
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
                raise MalformedInputError(f"prompt token ids must be integers in [0, {vocab})")
            ids, text = tuple(prompt), None
        if not ids:
            raise MalformedInputError("the prompt is empty")
        self._check_tokens(len(ids))
        chain = DigestChain(ids)
        end = len(ids)
        recovery = RecoveryPosition(RecoveryKind.P, end, chain.identity(end), None, "raw input: no typed rewrite")
        return RenderedPrompt(token_ids=ids, text=text, recovery_position=recovery,
                              rewrite_execution_frontiers=(end,), chain=chain)
