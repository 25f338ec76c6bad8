"""`Engine`: the public Python API around the Program and the EngineCore control thread.

    engine = Engine(EngineConfig())            # loads, compiles every bucket, starts the loop
    engine.generate("Hello", SamplingParams(temperature=0, max_tokens=16)).text
    handle = engine.submit([1, 2, 3]); for delta in handle.stream(): ...
    engine.chat([{"role": "user", "content": "hi"}])
    engine.stats(); engine.check_integrity(); engine.close()

Requests are validated on the caller's thread (a bad one raises there and touches nothing
else); the engine thread owns every record, plan and buffer (G-8). `start=False` gives a
manually stepped engine (`engine.step()`), which tests use to check integrity every cycle.

Failures (TXN-2, doctrine 3): an exception out of a cycle goes to the single failure cleanup
(engine/failure.py): every live request ends with finish_reason "error" and an `EngineFailure`
message, `engine.failure` holds it, and the engine is closed for good. Nothing waits on a dead
loop: handles are finished, `stats()` answers from the last counters, `close()` returns.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import sys
import threading
import time
from typing import Sequence

from ninfer_jax.config import EngineConfig
from ninfer_jax.engine.core import EngineCore
from ninfer_jax.engine.failure import end_pending, fail_all
from ninfer_jax.engine.grammar import Grammars, tool_call_form_of
# Request-side rules shared with the CLI's preflight (engine/preflight.py), which applies them
# before any weight is loaded; the engine applies them again at submission.
from ninfer_jax.engine.intake import chat_frontend, generation_defaults, load_tokenizer, message, prompt_ids
from ninfer_jax.engine.observe import occupancy
import ledger
from ledger import PointKind
from ninfer_jax.engine.request import RequestHandle
from ninfer_jax.engine.reuse import SavePoint
from ninfer_jax.engine.types import Completion, SamplingParams
from ninfer_jax.errors import EngineClosedError, EngineFailure, QueueFullError, RequestError
from ninfer_jax.program.host_heap import release_free_heap

log = logging.getLogger("ninfer.engine")


def saves_of(rendered) -> list[SavePoint]:
    """The save points of a rendered chat (SAVE-1): the input recovery point at C, R or P with
    its typed R kind (REC-3..6), and a shared entry at each resolved marker (SH-1..7); a marker
    on the recovery frontier shares that capture."""
    rp = rendered.recovery_position
    kind = rp.rewrite_point.kind.value if rp.rewrite_point is not None else ledger.InputKind.RAW
    out = {rp.frontier: SavePoint(rp.frontier, PointKind.INPUT, kind)}
    for m in rendered.markers:
        prev = out.get(m.frontier)
        explicit = bool(m.explicit)
        if prev is None:
            out[m.frontier] = SavePoint(m.frontier, None, shared=True, explicit=explicit)
        else:
            out[m.frontier] = prev._replace(shared=True, explicit=explicit or (prev.shared and prev.explicit))
    return [out[f] for f in sorted(out)]


class Engine:
    def __init__(self, config: EngineConfig | None = None, *, program=None, start: bool = True, cost_model=None):
        """`cost_model`: a `ninfer_jax.program.calibrate.CostRates` to use instead of calibrating
        at warm-up (SRC-3: it orders sources and picks the auto pause route, nothing else)."""
        self.config = config if config is not None else EngineConfig()
        t0 = time.perf_counter()
        # Read before any weight loads: a bad generation_config.json or chat template file is a
        # ConfigError here, never a refusal of every request (engine/intake.py).
        self._generation_defaults = generation_defaults(self.config.model)
        self.tokenizer = self._load_tokenizer()
        if program is None:
            from ninfer_jax.program.program import Program

            if self.config.speculative_tokens:  # a model without an MTP head is refused before loading it
                from ninfer_jax.engine.preflight import itemsize, model_config
                from ninfer_jax.plan import speculative_pools

                speculative_pools(self.config, model_config(self.config.model), itemsize(self.config))

            if self.config.progress:
                print(f"[ninfer] loading {self.config.model} ({self.config.resolved_dtype})", file=sys.stderr)
            program = Program(self.config)
        self.program = program
        reach = getattr(program, "config", self.config).max_context
        if reach != self.config.max_context:  # CFG-6: an explicit Main KV below one max_context
            if self.config.progress:
                print(f"[ninfer] max_context lowered from {self.config.max_context:,} to {reach:,} tokens: the "
                      f"Main KV holds {reach:,} (kv_capacity); a longer request is refused at submission",
                      file=sys.stderr)
            self.config = dataclasses.replace(self.config, max_context=reach)
        if cost_model is not None:  # set before warm-up, which then measures nothing (SRC-3)
            from ninfer_jax.program.calibrate import checked

            program.cost_model = checked(cost_model)
        self.program.warmup()
        release_free_heap()  # what loading and compiling freed, glibc would keep as RSS (issue 33)
        self.warmup_seconds = time.perf_counter() - t0
        grammars = None
        if self.tokenizer is not None:  # structured output compiles against the model's vocabulary
            grammars = Grammars(self.tokenizer.backend.to_str(), program.vocab_size, program.eos_token_ids,
                                {t.content: t.id for t in self.tokenizer.added_tokens},
                                tool_call_form_of(self.tokenizer.chat_template))
        self.core = EngineCore(program, self.tokenizer_decode if self.tokenizer else None,
                               max_queue=self.config.max_queue,
                               pieces=self.tokenizer.byte_pieces() if self.tokenizer else None, grammars=grammars)
        self._chat = None
        self._closed = False  # no new requests: closing, closed or failed
        self._stop = False  # the loop thread exits
        self._intake = threading.Lock()  # a submit is posted before `_closed` is set, or refused
        self._close_lock = threading.Lock()
        self.failure: EngineFailure | None = None  # set once, by the failure cleanup (TXN-2)
        self._wake = threading.Event()
        self._thread = None
        if start:
            self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
            self._thread.start()

    # ---- set-up ------------------------------------------------------------------------
    def _load_tokenizer(self):
        return load_tokenizer(self.config.model, self.config.chat_template)

    def generation_defaults(self) -> dict:
        """The sampling defaults of the checkpoint's generation_config.json (temperature, top_p,
        top_k, min_p, repetition/presence/frequency penalty, where set): what the servers give a
        request for the fields it leaves unset. {} for the built-in model. The Python API does
        not apply them: a SamplingParams is taken as it is."""
        return dict(self._generation_defaults)

    def tokenizer_decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- the loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop:
                if not self.core.has_work() and self.core.inbox.empty():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                self.core.step()
        except BaseException as exc:  # TXN-2: even a BaseException ends every handle
            log.error("engine cycle failed; ending every request", exc_info=exc)
            self._fail(exc)

    def step(self) -> None:
        """Run one cycle on this thread (engines built with start=False). If the cycle raises,
        the failure cleanup runs (TXN-2) and the original exception is re-raised; later calls
        raise EngineClosedError."""
        if self._thread is not None:
            raise RuntimeError("this engine runs its own thread; step() is for start=False engines")
        if self.failure is not None:
            raise self._closed_error()
        try:
            self.core.step()
        except BaseException as exc:
            self._fail(exc)
            raise

    def _fail(self, exc: BaseException) -> None:
        """TXN-2: the engine's single failure cleanup; the state is untrusted, so every live
        request ends with an error and the engine stays closed."""
        with self._intake:
            self._closed = True
            self.failure = EngineFailure(exc)
        fail_all(self.core, self.failure, self._closed_error())

    def _closed_error(self) -> EngineClosedError:
        if self.failure is not None:
            return EngineClosedError(str(self.failure))
        return EngineClosedError("the engine is closed")

    def _post(self, kind: str, payload) -> None:
        """Post "submit" / "cancel" / "call" to the core's inbox (engine/intake.py) and wake the loop."""
        self.core.inbox.put(message(kind, payload))
        self._wake.set()

    def _call(self, fn):
        """Run fn on the engine thread between cycles and return its result. Once the loop is
        gone (failed or closed) it raises EngineClosedError instead of waiting (TXN-2)."""
        if self.failure is not None:
            raise self._closed_error()
        if self._thread is None:
            return fn()
        box: queue.SimpleQueue = queue.SimpleQueue()
        self._post("call", (fn, box))
        while True:
            alive = self._thread.is_alive()  # read before waiting: an answer posted before death is in the box
            try:
                ok, value = box.get(timeout=0.1)
                break
            except queue.Empty:
                if not alive:
                    raise self._closed_error() from None
        if not ok:
            raise value
        return value

    # ---- requests ----------------------------------------------------------------------
    def _prompt_ids(self, prompt) -> list[int]:
        return prompt_ids(prompt, self.tokenizer, self.config.model)

    def submit(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None, *,
               request_id: str | None = None, session=None, anchors: Sequence[int] = (),
               markers: Sequence[int] = (), recovery_point: int | None = None, images: Sequence = (),
               videos: Sequence = ()) -> RequestHandle:
        """Queue one raw prompt; returns at once with its handle. Its input recovery position is
        P, the prompt's end (REC-6), unless `recovery_point` names another token frontier (a
        pre-tokenising client that knows where its chat structure lies: the end of the
        conversation before the generation prompt, say); `anchors` are explicit private anchor
        frontiers (REC-1, at most 4), `markers` token frontiers for shared entries (SH-1, at
        most 4). A frontier outside [1, len(prompt)] is refused, never dropped.

        `images` / `videos` (a checkpoint with a vision tower): with token ids, (pixel_values,
        grid_thw) pairs or prepared items (`frontend.media.prepare_image`), in order, for the
        placeholder runs the ids already hold as the reference processor expands them; with
        text, images as bytes or URLs (the media policy's), placed where the text writes
        `<|vision_start|><|image_pad|><|vision_end|>` or else before it. A frontier inside a
        media item's run is refused (SH-7)."""
        if isinstance(prompt, str) and (images or videos):  # text: its placeholders expanded here
            if videos:
                raise RequestError("videos with a text prompt: send them in a chat message (submit_chat)")
            self._check_takes_media()
            expansion = self._frontend().expand_prompt(prompt, images)
            ids = list(expansion.token_ids)
            media = self._media(ids, [m.prepared for m in expansion.media], (), expansion.ranges)
        else:
            ids = self._prompt_ids(prompt)
            media = self._media(ids, images, videos) if (images or videos) else None
        if len(set(markers)) > 4:
            raise RequestError("markers: at most 4 shared markers per request (SH-2)")
        for name, values in (("anchors", anchors), ("markers", markers),
                             ("recovery_point", () if recovery_point is None else (recovery_point,))):
            for f in values:
                if not isinstance(f, int) or isinstance(f, bool) or not 1 <= f <= len(ids):
                    raise RequestError(f"{name}: token frontier {f!r} outside [1, {len(ids)}] (the prompt's length)")
                if media is not None and media.inside(f):
                    raise RequestError(f"{name}: token frontier {f} lies inside a media item (SH-7)")
        end = len(ids) if recovery_point is None else recovery_point
        saves = {end: SavePoint(end)}
        for f in anchors:
            saves[int(f)] = SavePoint(int(f), PointKind.ANCHOR)
        for f in markers:
            prev = saves.get(int(f))
            saves[int(f)] = (prev._replace(shared=True) if prev is not None
                             else SavePoint(int(f), None, shared=True))
        return self._submit(ids, sampling, request_id, saves=list(saves.values()), session=session, raw=True,
                            media=media)

    def _media(self, ids, images, videos, ranges=None):
        """The request's `RequestMedia` (engine/media.py), checked before anything is queued:
        MediaNotSupportedError where this engine takes no media, RequestError for media that
        does not match the prompt's placeholders."""
        from ninfer_jax.engine.media import RequestMedia

        self._check_takes_media()
        return RequestMedia.of(self.program.model, ids, images, videos, ranges)

    def _check_takes_media(self) -> None:
        from ninfer_jax.engine.intake import media_refusal
        from ninfer_jax.frontend.errors import MediaNotSupportedError

        if not self.program.takes_media:
            raise MediaNotSupportedError(media_refusal(self.config, getattr(self.program.model, "vision", None)
                                                       is not None))

    def _submit(self, ids, sampling, request_id, *, saves, splits=(), session=None, raw=False,
                media=None) -> RequestHandle:
        if self._closed:
            raise self._closed_error()
        if len(self.core.fresh) + self.core.inbox.qsize() >= self.config.max_queue:
            raise QueueFullError(f"the queue holds {self.config.max_queue} requests; retry later")
        if request_id is not None and request_id in self.core.by_id:
            raise RequestError(f"request_id {request_id!r} is already in use by a running request")
        if len([s for s in saves if s.private == PointKind.ANCHOR]) > 4:
            raise RequestError("anchors: at most 4 explicit private anchors per request (REC-1)")
        req = self.core.make_request(ids, sampling or SamplingParams(), request_id,
                                     lambda rid: self._post("cancel", rid), saves=saves, splits=splits,
                                     session=session, raw=raw, media=media)
        with self._intake:  # posted before the engine closes (its close or cleanup ends it), or refused
            if self._closed:
                raise self._closed_error()
            if not self.core.reserve_id(req.request_id):  # one still queued in the inbox, say
                raise RequestError(f"request_id {req.request_id!r} is already in use by a queued or running request")
            self._post("submit", req)
        return req.handle

    def generate(self, prompt: str | Sequence[int], sampling: SamplingParams | None = None) -> Completion:
        """Submit and wait. With start=False, steps the engine until the request finishes (a
        failing cycle re-raises here, see `step`)."""
        handle = self.submit(prompt, sampling)
        while self._thread is None and not handle.done():
            self.step()
        return handle.result()

    def _frontend(self):
        if self._chat is None:
            self._chat = chat_frontend(self.tokenizer, self.config, getattr(self.program.model, "vision", None)
                                       is not None)
        return self._chat

    def submit_chat(self, messages: list[dict], *, tools=None, session=None, cache_markers=None, anchors=None,
                    sampling: SamplingParams | None = None, request_id: str | None = None,
                    template_kwargs: dict | None = None) -> RequestHandle:
        """Render the conversation with the model's chat template and queue it. The frontend
        chooses every frontier the cache saves at: the input recovery point (C or typed R),
        shared markers (explicit and the automatic one), explicit private anchors.
        `template_kwargs`: extra variables for the template (`enable_thinking`, ...)."""
        frontend = self._frontend()
        rendered = frontend.render_chat(messages, tools=tools, cache_markers=cache_markers,
                                        template_kwargs=template_kwargs)
        anchored = None
        if anchors:
            anchored = frontend.render_chat(messages, tools=tools, cache_markers=anchors, marker_policy="none",
                                            template_kwargs=template_kwargs)
        return self.submit_rendered(rendered, sampling=sampling, request_id=request_id, session=session,
                                    anchors=anchored)

    def submit_rendered(self, rendered, *, sampling: SamplingParams | None = None, request_id: str | None = None,
                        session=None, anchors=None, prompt_anchor: bool = False) -> RequestHandle:
        """Queue a prompt the chat frontend rendered (`render_chat`, `render_responses(...).prompt`):
        it saves at the frontiers the rendering chose; `anchors`, a rendering of the same
        conversation with the anchors as its only markers, adds those as private anchors;
        `prompt_anchor` adds one at the prompt's end (the first of n choices: the others then
        start from the whole prompt, an exact hit)."""
        media = None
        items = tuple(getattr(rendered, "media", ()))
        if items:  # its placeholders run with their media, never as text (a fluent wrong answer)
            self._check_takes_media()
            ranges = tuple(rendered.media_ranges)
            if len(ranges) != len(items):
                raise RequestError(f"the rendered prompt holds {len(items)} media items but {len(ranges)} ranges")
            media = self._media(list(rendered.token_ids), [m for m, r in zip(items, ranges) if r.kind == "image"],
                                [m for m, r in zip(items, ranges) if r.kind == "video"], ranges)
        saves = saves_of(rendered)
        if anchors is not None:
            saves += [SavePoint(m.frontier, PointKind.ANCHOR) for m in anchors.markers]
        end = len(rendered.token_ids)
        if prompt_anchor and all(s.frontier != end for s in saves):
            saves.append(SavePoint(end, PointKind.ANCHOR))
        if media is not None:
            bad = next((s.frontier for s in saves if media.inside(s.frontier)), None)
            if bad is not None:
                raise RequestError(f"save frontier {bad} lies inside a media item (SH-7)")
        return self._submit(list(rendered.token_ids), sampling, request_id, saves=saves,
                            splits=rendered.rewrite_execution_frontiers, session=session, media=media)

    def chat_frontend(self):
        """The chat frontend of this engine's tokenizer (templates, markers, Responses input)."""
        return self._frontend()

    def chat(self, messages: list[dict], tools=None, session=None, cache_markers=None,
             sampling: SamplingParams | None = None, anchors=None, template_kwargs: dict | None = None) -> Completion:
        handle = self.submit_chat(messages, tools=tools, session=session, cache_markers=cache_markers,
                                  anchors=anchors, sampling=sampling, template_kwargs=template_kwargs)
        while self._thread is None and not handle.done():
            self.step()
        return handle.result()

    # ---- observation -------------------------------------------------------------------
    def stats(self) -> dict:
        """OBS-1 counters (requests, prefill vs replay vs reused tokens, hits, transfers,
        pauses and resumes by route, capacity errors, compilations), gauges, and `cost_model`
        (the source cost model's rates in seconds and where they came from). Once the loop
        is gone it answers from the last counters, plus `failed` and `failure` after a failure."""
        def snapshot():
            out = dict(self.core.counters)
            # compilations: executables built; of them, compilations_from_cache were read back
            # from JAX's persistent compilation cache (nothing compiled)
            out.update(compilations=self.program.compilations,
                       compilations_from_cache=self.program.compilations_from_cache,
                       residents=len(self.core.residents),
                       media_cache_bytes=self.core.media_cache.nbytes,  # the tower's outputs kept
                       queued=len(self.core.fresh), paused=len(self.core.preempt),
                       warmup_seconds=self.warmup_seconds,
                       cost_model=self.core.reuse.rates.stats())  # SRC-3: the prices in use
            # Speculative decoding (issue 17): acceptance of draft position j (1-based j+1), drafts
            # not emitted, and tokens emitted per Verify unit (1 + accepted drafts on average).
            out["spec_accepted_by_position"] = list(self.core.spec_accepted_by_position)
            out["spec_rejected_tokens"] = out["spec_drafted_tokens"] - out["spec_accepted_tokens"]
            units = out["spec_verify_units"]
            out["spec_mean_accepted_length"] = 1.0 + out["spec_accepted_tokens"] / units if units else 0.0
            out.update(occupancy(self.program.state))
            out["histograms"] = {k: h.snapshot() for k, h in self.core.histograms.items()}
            return out
        try:
            return self._call(snapshot)
        except EngineClosedError:
            if self._thread is not None:
                self._thread.join(timeout=1.0)  # a failure cleanup may still be finishing
                if self._thread.is_alive():
                    raise
        out = snapshot()  # the loop is gone: nothing else touches the core (TXN-2)
        if self.failure is not None:
            out.update(failed=True, failure=str(self.failure))
        return out

    def model_info(self) -> dict:
        model = self.program.model  # None for the cost-model Program (engine/contract.py)
        mc = model.config if model is not None else None
        return {"name": self.config.model, "model_type": mc.model_type if mc else "sim",
                "vocab_size": self.program.vocab_size, "max_context": self.config.max_context,
                "max_concurrency": self.config.max_concurrency,
                "dtype": self.program.dtype,
                "eos_token_ids": list(self.program.eos_token_ids), "kv_pages": self.program.capacity.kv_pages,
                "state_slots": self.program.capacity.state_slots}

    def check_integrity(self) -> None:
        """Recompute every pool, arena extent, reference and binding from first principles
        (doctrine 2); raises `ledger.IntegrityError` on any disagreement, EngineClosedError
        after a failure (TXN-2: its state is not trusted, there is nothing to check)."""
        self._call(self.core.check_integrity)

    def clear_cache(self) -> None:
        """Drop every cached recovery point (only while no request is running or paused)."""
        self._call(self.core.clear_cache)

    def close(self) -> None:
        """Cancel what is left and stop the loop. After a failure (TXN-2) nothing is left to
        cancel: it returns at once."""

        def cancel_all():
            for req in list(self.core.by_id.values()):
                self.core.finish(req, "cancelled")

        with self._close_lock:
            with self._intake:
                first, self._closed = not self._closed, True  # submit refuses from here on
            if first:
                try:
                    self._call(cancel_all)
                except EngineClosedError:
                    pass  # the loop failed meanwhile: its cleanup ended every request
            self._stop = True
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=30)
            if self._thread is None or not self._thread.is_alive():
                # Submitted but never taken in (a start=False engine not stepped since).
                end_pending(self.core, "cancelled", None, self._closed_error())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
