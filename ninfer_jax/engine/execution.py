"""Execution: the Program's steps run for the cycle's rows, and the tokens they produce (SCH-1,
SCH-8, OBS-1).

A mixin of `EngineCore` (like units.py): one compact decode batch — or, with speculative
decoding, one Verify unit per row (issue 17) — and one prefill chunk per cycle; each chunk's
end reports compute demand and captures at the semantic frontier it ended on (HEAT-2, SAVE-*);
sampling commits each row's next token, streams it and says whether it finished the request.
The compute time the engine reports is the Program's own (`_compute`).

A row held to a grammar (structured output) needs its token mask before it is sampled; the masks
of a decode step's rows are computed on a worker thread while the step runs (llguidance and the
device wait both release the GIL) and applied to the logits on the device, batched, by the
compiled mask step (model/token_mask.py), so constrained rows add little to the step's wall time
and a greedy one is chosen by the batch's argmax like a free row.
"""
from __future__ import annotations

import concurrent.futures
import time

import numpy as np

import ninfer_jax.engine.sampling as sampling
from ninfer_jax.engine.request import DECODE, Request
from ninfer_jax.engine.types import TokenDelta
from ninfer_jax.model import token_mask
from ninfer_jax.program.program import DecodeRow


_MASKS: concurrent.futures.ThreadPoolExecutor | None = None  # one worker for every engine's masks


def _mask_worker() -> concurrent.futures.ThreadPoolExecutor:
    global _MASKS
    if _MASKS is None:
        _MASKS = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninfer-grammar")
    return _MASKS


def _masks_during_step(rows: list[Request], unpacked: bool):
    """Start the next-token masks of the rows held to a grammar (None: no such row): their
    bitmasks (`Matcher.bitmask`), or `[V]` bool when `unpacked` (the host path of a Verify unit).
    Nothing else reads a matcher meanwhile."""
    held = [i for i, r in enumerate(rows) if r.matcher is not None and not r.sampling.forced_output]
    if not held:
        return None
    return held, _mask_worker().submit(
        lambda: [rows[i].matcher.allowed() if unpacked else rows[i].matcher.bitmask() for i in held])


def _step_masks(n: int, pending):
    """The decode step's `masks`: the `n` rows' bitmasks once the worker has them (a free row's all ones)."""
    held, future = pending

    def masks() -> np.ndarray:
        done = future.result()
        bits = np.full((n, len(done[0])), token_mask.ALL)
        for i, b in zip(held, done):
            bits[i] = b
        return bits
    return masks


def _take_masks(rows: list[Request], pending) -> None:
    if pending is not None:
        held, future = pending
        for i, mask in zip(held, future.result()):
            rows[i].next_allowed = mask


def _allowed(req: Request):
    """The row's mask for its next token: the one computed during the step, else now."""
    if req.matcher is None:
        return None
    mask, req.next_allowed = req.next_allowed, None
    return mask if mask is not None else req.matcher.allowed()


class Execution:
    def _compute(self, step, *args, **kw):
        """Run one Program step and count its compute: the Program's own `step_seconds` when it
        keeps one (the compiled call until its logits are on the host; building the inputs is
        control work), else (None) the call's wall time (the cost-model Program)."""
        before = self.program.step_seconds
        t0 = time.perf_counter()
        out = step(*args, **kw)
        if before is None:
            self.compute_seconds += time.perf_counter() - t0
        else:
            self.compute_seconds += self.program.step_seconds - before
        return out

    def _run_decode(self, rows: list[Request]) -> None:
        if self.spec_k:
            self._run_verify(rows)
            return
        # The rows' page lists are passed as they are (read during the call, never kept): a
        # 45k-token context holds ~700 pages, copied for nothing every cycle otherwise.
        step = [DecodeRow(r.output[-1], r.fed, r.pages, r.slot,
                          rope=r.media.decode_rope(r.fed) if r.media is not None else None) for r in rows]
        # Rows held to a grammar: their masks are computed while the step runs and applied to the
        # logits in the compiled mask step, so a greedy one joins the batch's argmax.
        masks = _masks_during_step(rows, unpacked=False)
        if masks is None:
            logits = self._compute(self.program.decode, step)
        else:
            logits = self._compute(self.program.decode, step, masks=_step_masks(len(rows), masks))
        self.counters["decode_steps"] += 1
        plain = [sampling.plain_greedy(r.sampling, masked=True) for r in rows]
        picks = sampling.greedy_rows(logits[:len(rows)]) if any(plain) else None  # one argmax for the batch
        now = self.program.clock()  # one step's tokens all appear at once
        for i, r in enumerate(rows):
            r.fed += 1
            if r.fed > r.computed:
                r.computed = r.fed
            if plain[i]:  # chosen by the batch's argmax; its logits are not read again
                self._sample(r, None, picks[i], now)
            else:
                self._sample(r, logits[i], None, now, masked=True)

    def _run_verify(self, rows: list[Request]) -> None:
        """Speculative decode (issue 17): each row's Verify unit scores its token and its drafts
        in one step; the emitted tokens are the target's own choices at each position (greedy:
        the argmax; sampled: the draw of `sampling.sample` with the position's uniform; forced:
        the recorded token), accepted drafts being those equal to that choice. This is the
        standard speculative sampling for a deterministic drafter (accept d with probability
        min(1, p(d)/q(d)) = p(d), else draw from the residual p without d), with the acceptance
        uniform and the residual draw coupled through the one (seed, position) uniform: the
        tokens are exactly those of decoding without drafts (doctrine 1), across batching,
        reuse and pauses. The state is committed at the last token fed (CKP-2/3); a rejected
        position leaves nothing that is ever read."""
        wanted = [self._drafts(r) for r in rows]
        masks = _masks_during_step(rows, unpacked=True)  # the first position's; the next follow each choice
        logits, drafts = self._compute(self.program.spec_decode,
                                       [DecodeRow(r.output[-1], r.fed, r.pages, r.slot, r.mtp_pages,
                                                  r.media.decode_rope(r.fed) if r.media is not None else None)
                                        for r in rows],
                                       wanted)
        _take_masks(rows, masks)
        self.counters["decode_steps"] += 1
        now = self.program.clock()
        keep, ends = [], []
        for i, r in enumerate(rows):
            choices = self._verified_choices(r, logits[i], drafts[i], wanted[i])
            reason = None
            fed = 0
            for token, lp in choices:  # emitted in order; a finish drops the rest (never fed)
                reason = self._emit(r, token, lp, now)
                fed += 1
                if reason is not None:
                    break
            if r.matcher is not None and not r.sampling.forced_output:
                r.matcher.rollback(len(choices) - fed)  # chosen after a stop: never emitted
            accepted = min(fed, len(choices) - 1)  # drafts among the emitted tokens
            self.counters["spec_verify_units"] += 1
            self.counters["spec_drafted_tokens"] += wanted[i]
            self.counters["spec_accepted_tokens"] += accepted
            for j in range(accepted):
                self.spec_accepted_by_position[j] += 1
            keep.append(fed - 1)  # positions n .. n+fed-1 were fed: the state after n+fed-1 is kept
            ends.append((r, fed, reason))
        self._compute(self.program.spec_commit, keep)
        for r, fed, reason in ends:
            r.fed += fed
            if r.fed > r.computed:
                r.computed = r.fed
            if reason is not None:
                self._finish(r, reason)

    def _verified_choices(self, req: Request, logits, drafts, wanted: int) -> list:
        """(token, logprob entry) of each position the Verify unit decides: the target's choice at
        positions n+1.., up to and including the first that differs from its draft (or the bonus
        token after `wanted` accepted drafts)."""
        sp = req.sampling
        out = list(req.output)
        base = len(req.prompt)
        choices = []
        for j in range(wanted + 1):
            lp = None
            if sp.forced_output:
                token = sp.forced_output[len(out)]
                if sp.logprobs:
                    lp = sampling.logprob_of(logits[j], sp, token, req.prompt, out)
            elif sampling.plain_greedy(sp):
                token = int(np.argmax(np.asarray(logits[j], np.float32)))
            else:
                token, lp = sampling.sample(logits[j], sp, req.seed, base + len(out), req.prompt, out,
                                            sampling.held_ids(req.stop_ids, sp, out), _allowed(req))
                if req.matcher is not None:  # the next position's mask follows this choice
                    req.matcher.consume(token)
            choices.append((token, lp))
            out.append(token)
            if j == wanted or token != int(drafts[j]):
                break
        return choices

    def _run_prefill(self, req: Request) -> None:
        n = self._chunk(req)
        tokens = req.target[req.fed:req.fed + n]
        media = self._chunk_media(req, n) if req.media is not None else None
        kw = {"media": media} if media else {}
        if req.prompt_lps is not None and len(req.prompt_lps) < len(req.prompt):
            kw["all_logits"] = True  # prompt_logprobs: every position's logits, this chunk on
        logits = self._compute(self.program.prefill, tokens, req.fed, req.pages, req.slot,
                               *((req.mtp_pages,) if self.spec_k else ()), **kw)
        if kw.get("all_logits"):
            self._record_prompt_logprobs(req, logits)
            logits = logits[-1]
        self.counters["prefill_chunks"] += 1
        replay = req.replaying
        # OBS-1: recomputing what was computed before a pause is Replay; the rest is prefill.
        self.counters["replay_tokens" if replay else "prefill_tokens"] += n
        lo = req.fed
        req.fed += n
        req.computed = max(req.computed, req.fed)
        if not replay:
            self.preempt.end_recovery(req)  # RES-5: a new prefill commit is real new progress
            self._after_prefill(req, lo)
        if req.fed < len(req.target):
            return
        req.phase = DECODE
        if not req.output:
            self._sample(req, logits)  # the prompt's end: its first token
        # else the binding is rebuilt; the pending token is decoded next (PAUSE-5)

    def _record_prompt_logprobs(self, req: Request, logits) -> None:
        """The entries of the prompt tokens this chunk's logits predict (position p's logits give
        token p + 1's), those not recorded yet (a Replay recomputes some): the raw distribution."""
        top = req.sampling.prompt_logprobs
        for j in range(len(logits)):
            nxt = req.fed + j + 1
            if nxt == len(req.prompt_lps) and nxt < len(req.prompt):
                req.prompt_lps.append(sampling.prompt_entry(logits[j], req.prompt[nxt], top))

    def _chunk_media(self, req: Request, n: int):
        """The media inputs of the request's next `n` tokens: each item they cover comes from
        the media cache, encoded on a miss; encoding an item this request had encoded before
        (its output left the cache meanwhile) is a re-encode (PAUSE-6)."""
        def embed_of(i: int):
            key = req.media.keys[i]
            out, encoded = self.media_cache.get(key, lambda: self._compute(self.program.encode_media,
                                                                          *req.media.pixels[i]))
            if encoded:
                self.counters["vision_encodes"] += 1
                if key in req.encoded:
                    self.counters["vision_reencodes"] += 1
                req.encoded.add(key)
            else:
                self.counters["media_cache_hits"] += 1
            return out

        cfg = self.program.model.config
        return req.media.chunk(req.fed, n, self.program.chunk_size, embed_of, cfg.hidden_size,
                               self.program.model.dtype)

    def _after_prefill(self, req: Request, lo: int) -> None:
        """Report compute demand (HEAT-2) and capture at the semantic frontier the chunk ended
        on (SAVE-1); a capture that cannot be admitted is skipped, never blocking (SAVE-5)."""
        frontiers = [s.frontier for s in req.saves]
        self.reuse.observe(req.ticket, self.reuse.identity_at(req, len(req.target)), lo, req.fed, frontiers)
        for save in req.saves:
            if save.frontier == req.fed and self.reuse.capture(self.reuse.view_of(req), save):
                req.saved_tokens = max(req.saved_tokens, min(save.frontier, len(req.prompt)))

    def _sample(self, req: Request, logits, token: int | None = None, now: float | None = None,
                masked: bool = False) -> None:
        """Commit the row's next token: `token` when the batch already chose it (plain greedy
        rows share one argmax), else drawn from `logits` here. `now`: the batch's clock;
        `masked`: the logits are held to the row's grammar already (a decode step's mask step)."""
        lp = None
        sp = req.sampling
        output = req.output
        if sp.forced_output:  # replay of a recorded output: the same decode path, no draw
            token = sp.forced_output[len(output)]
            lp = sampling.logprob_of(logits, sp, token, req.prompt, output) if sp.logprobs else None
        else:
            if token is None:
                position = len(req.prompt) + len(output)
                token, lp = sampling.sample(logits, sp, req.seed, position, req.prompt, output,
                                            sampling.held_ids(req.stop_ids, sp, output),
                                            None if masked else _allowed(req), grammar=masked)
            if req.matcher is not None:
                req.matcher.consume(token)
        reason = self._emit(req, token, lp, now)
        if reason is not None:
            self._finish(req, reason)

    def _emit(self, req: Request, token: int, lp, now: float | None = None) -> str | None:
        """Append a chosen token to the output and stream it; returns the finish reason it
        causes ("stop", "length") or None. The caller finishes the request."""
        if req.recovery_permit is not None:
            self.preempt.end_recovery(req)  # RES-5: a generated token is real new progress
        sp = req.sampling
        output = req.output
        if now is None:
            now = self.program.clock()
        if req.t_first_token is None:
            req.t_first_token = now
            self.histograms["time_to_first_token_seconds"].observe(now - req.t_submit)
        else:
            gap = now - req.t_last_token
            if gap > req.max_gap:
                req.max_gap = gap
            self.histograms["inter_token_seconds"].observe(gap)
        req.t_last_token = now
        output.append(token)
        self.counters["generated_tokens"] += 1
        if lp is not None:
            req.logprobs.append(lp)
        detok = req.detok
        stop_id = token in req.stop_ids
        # A stop id's own text is not output unless asked for (vLLM's include_stop_str_in_output).
        text = detok.flush() if stop_id and not sp.include_stop_str_in_output else detok.push(token)
        req.outbox.push(TokenDelta((token,), text, (lp,) if lp is not None else ()))
        n = len(output)
        if detok.stopped or stop_id or n == len(sp.forced_output) > 0:
            return "stop"
        if n >= sp.max_tokens or len(req.prompt) + n >= req.max_context:
            return "length"
        return None
