"""The engine's single failure cleanup (TXN-2: "device errors go to the engine's single failure
cleanup"; doctrine 3: a clear, typed error).

An exception out of `EngineCore.step()` (a bug, or a device error in a compiled step) leaves the
core in an unknown state: the pools are donated buffers that a failed step may have invalidated,
and a plan may be half committed. Nothing is retried. `fail_all` ends every live request —
queued, resident, paused, or still in the inbox — with finish_reason "error" and the
`EngineFailure` message, releasing what each held through the core's normal `finish` where that
still works and finishing its handle directly where it does not, so no caller ever blocks. The engine
then stays closed (engine.py).
"""
from __future__ import annotations

import queue

from ninfer_jax.engine.intake import Call, Submit
from ninfer_jax.engine.request import FINISHED


def take_inbox(core, refusal: BaseException) -> list:
    """Empty the core's inbox (any thread): returns the submitted requests it never took in;
    pending calls are answered with `refusal`; cancels have nothing left to cancel."""
    pending = []
    while True:
        try:
            msg = core.inbox.get_nowait()
        except queue.Empty:
            return pending
        if isinstance(msg, Submit):
            pending.append(msg.request)
        elif isinstance(msg, Call):
            msg.box.put((False, refusal))


def end_directly(core, req, reason: str, error: str | None) -> None:
    """Finish a request without the ledger (it may be what failed): forget it in the core's
    structures, count it once, and finish its handle (best effort, never raises)."""
    for forget in (lambda: core.fresh.remove(req), lambda: core.residents.remove(req),
                   lambda: core.preempt.remove(req)):
        try:
            forget()
        except Exception:  # noqa: BLE001 - not there, or the structure is what broke
            pass
    if req.phase != FINISHED:  # `finish` counts once it set FINISHED
        core.counters["requests_failed" if reason == "error" else "requests_" + reason] += 1
    req.phase, req.finish_reason, req.error = FINISHED, reason, error
    if core.by_id.get(req.request_id) is req:
        del core.by_id[req.request_id]
    core.release_id(req.request_id)
    if not req.outbox.done():
        req.outbox.finish(req.completion())


def end_pending(core, reason: str, error: str | None, refusal: BaseException) -> int:
    """End what the inbox still holds (any thread, once the loop is gone): each submitted
    request is counted as submitted and ended with `reason`; calls get `refusal`."""
    pending = take_inbox(core, refusal)
    for req in pending:
        core.counters["requests_submitted"] += 1
        end_directly(core, req, reason, error)
    return len(pending)


def fail_all(core, failure: BaseException, refusal: BaseException) -> int:
    """TXN-2: end every live request with finish_reason "error" and the typed message of
    `failure`; answer pending calls with `refusal`. Returns how many requests it ended."""
    message = f"{type(failure).__name__}: {failure}"
    live = sorted(core.by_id.values(), key=lambda r: r.ticket)
    for req in live:
        req.error = message
        try:
            core.finish(req, "error")  # releases what it held; counts requests_failed
        except BaseException:  # noqa: BLE001 - the state is untrusted: finish it without the ledger
            end_directly(core, req, "error", message)
    return len(live) + end_pending(core, "error", message, refusal)
