"""TXN-2: an exception inside an engine cycle goes to the single failure cleanup. Every live
request ends with finish_reason "error" and an `EngineFailure` message, nothing blocks on the
dead loop (result, stream, stats, close), and the engine stays closed (EngineClosedError).

Faults are injected by replacing the Program's compiled steps (`decode` / `prefill`). Every wait
is bounded, so a regression fails instead of hanging."""
import threading
import time

import pytest

from engine_helpers import HOST
from ninfer_jax import Engine, EngineConfig, SamplingParams
from ninfer_jax.errors import EngineClosedError, EngineFailure, QueueFullError
from ninfer_jax.program.program import Program
from ninfer_jax.sim import SimProgram

LONG = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
HANG_GUARD_S = 5.0  # only against hangs: not a speed requirement


class DeviceLost(RuntimeError):
    """Stands in for a device error raised by a compiled step."""


class Abort(BaseException):
    """Not an Exception: the loop must still end every handle."""


def _config(**overrides) -> EngineConfig:
    return EngineConfig(**{"max_concurrency": 2, "max_context": 256, "chunk_size": 32, "progress": False,
                           "context_cache": HOST, **overrides})


def _real_engine(model, start: bool) -> Engine:
    cfg = _config()
    return Engine(cfg, program=Program(cfg, model=model), start=start)


def _inject(monkeypatch, program, step: str, after: int, exc: BaseException) -> None:
    """`program.<step>` raises `exc` from its (after+1)-th call on."""
    real, calls = getattr(program, step), [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(program, step, faulty)


def _bounded(fn, timeout: float = HANG_GUARD_S):
    """Run fn on a helper thread; fail (instead of hanging) if it does not return in time."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} blocked for {timeout}s on a dead engine"
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - start


def _assert_failed_cleanly(engine: Engine, handles, cause: type, text: str) -> None:
    """Every request ended with the typed message; stats answers; the engine refuses work."""
    for h in handles:
        c = h.result(timeout=20)
        assert c.finish_reason == "error", c
        assert c.error.startswith("EngineFailure:") and cause.__name__ in c.error and text in c.error, c.error
        _bounded(lambda: list(h.stream()))  # the stream ends too
    assert isinstance(engine.failure, EngineFailure) and isinstance(engine.failure.cause, cause)
    stats, _ = _bounded(engine.stats)
    assert stats["failed"] is True and cause.__name__ in stats["failure"]
    assert stats["requests_failed"] == stats["requests_submitted"] == len(handles)
    assert stats["residents"] == 0 and stats["queued"] == 0
    with pytest.raises(EngineClosedError, match=cause.__name__):
        engine.submit([1, 2, 3], LONG)
    with pytest.raises(EngineClosedError, match="failed"):
        _bounded(engine.check_integrity)  # the state is not trusted: a clear error, not a hang
    _, took = _bounded(engine.close)
    assert took < HANG_GUARD_S
    _bounded(engine.close)  # idempotent


def _no_sequence_holds_anything(engine: Engine) -> None:
    """The normal release ran for every request: the ledger recount agrees and no active
    execution holds an object (only the cache may)."""
    engine.program.check_integrity()
    held = [(oid, h) for oid, obj in engine.program.state.objects.items() for h in obj.holders if h[0] == "seq"]
    assert not held, held
    assert not engine.program.state.permits


def test_txn2_threaded_decode_fault_ends_every_request(tiny_model, monkeypatch):
    engine = _real_engine(tiny_model, start=True)
    try:
        _inject(monkeypatch, engine.program, "decode", after=4, exc=IndexError("boom"))
        # Two residents (both lanes) and one queued request when the fifth decode raises.
        handles = [engine.submit([10 + i, 20, 30, 40], LONG) for i in range(3)]
        _assert_failed_cleanly(engine, handles, IndexError, "boom")
        assert handles[0].result().token_ids, "the fault hit mid-decode, after some tokens"
        _no_sequence_holds_anything(engine)
    finally:
        _bounded(engine.close)


def test_txn2_manual_step_reraises_after_the_cleanup(tiny_model, monkeypatch):
    """start=False: the failing `step()` re-raises the original exception after the cleanup;
    later steps raise EngineClosedError."""
    engine = _real_engine(tiny_model, start=False)
    try:
        handles = [engine.submit([5 + i] * 40, LONG) for i in range(3)]
        engine.step()
        engine.check_integrity()
        _inject(monkeypatch, engine.program, "prefill", after=0, exc=DeviceLost("INTERNAL: device lost"))
        with pytest.raises(DeviceLost):
            for _ in range(100):
                engine.step()
        with pytest.raises(EngineClosedError, match="DeviceLost"):
            engine.step()
        _assert_failed_cleanly(engine, handles, DeviceLost, "device lost")
        _no_sequence_holds_anything(engine)
    finally:
        _bounded(engine.close)


# ---- the same paths on the cost-model Program (no compilation) ------------------------------

def _sim_engine(start: bool, **overrides) -> Engine:
    cfg = _config(**overrides)
    return Engine(cfg, program=SimProgram(cfg), start=start)


def test_txn2_base_exception_in_the_loop_still_ends_every_handle(monkeypatch):
    engine = _sim_engine(start=True)
    gate = threading.Event()
    real = engine.program.decode

    def decode(rows):
        gate.wait(HANG_GUARD_S)  # hold the first decode until every request is in
        raise Abort()

    monkeypatch.setattr(engine.program, "decode", decode)
    try:
        handles = [engine.submit([1, 2, 3 + i], LONG) for i in range(4)]
        gate.set()
        _assert_failed_cleanly(engine, handles, Abort, "")
        assert not engine._thread.is_alive()
    finally:
        monkeypatch.setattr(engine.program, "decode", real)
        _bounded(engine.close)


def test_txn2_submits_racing_the_failure_end_or_are_refused(monkeypatch):
    """Requests posted after the fault but before the closed flag is seen still end."""
    engine = _sim_engine(start=True, max_concurrency=4)
    _inject(monkeypatch, engine.program, "decode", after=200, exc=IndexError("late"))
    handles, refused = [], []
    lock = threading.Lock()

    def submitter(k: int):
        for i in range(2000):
            try:
                h = engine.submit([k + 1, i % 500 + 1], SamplingParams(temperature=0, max_tokens=8))
            except EngineClosedError:
                with lock:
                    refused.append(k)
                return
            except QueueFullError:
                time.sleep(0.001)
                continue
            with lock:
                handles.append(h)
            time.sleep(0.0005)

    threads = [threading.Thread(target=submitter, args=(k,), daemon=True) for k in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert sorted(refused) == [0, 1, 2, 3], "every submitter saw EngineClosedError after the failure"
        results = [h.result(timeout=10) for h in handles]
        failed = [r for r in results if r.finish_reason == "error"]
        assert failed and all("EngineFailure" in r.error and "late" in r.error for r in failed)
        assert all(r.finish_reason in ("error", "length", "stop") for r in results)
        stats, _ = _bounded(engine.stats)
        assert stats["requests_failed"] == len(failed)
        assert stats["requests_submitted"] == len(handles)
    finally:
        _bounded(engine.close)


def test_txn2_cleanup_finishes_handles_even_when_release_raises(monkeypatch):
    """The ledger may be what broke: if the normal `_finish` raises too, the handle is finished
    directly (counted once) so no caller blocks."""
    engine = _sim_engine(start=False)
    handles = [engine.submit([7, 8, 9 + i], LONG) for i in range(3)]
    engine.step()

    def broken_finish(req, reason):
        raise RuntimeError("the ledger is broken too")

    monkeypatch.setattr(engine.core, "_finish", broken_finish)
    _inject(monkeypatch, engine.program, "decode", after=0, exc=DeviceLost("gone"))
    with pytest.raises(DeviceLost):
        engine.step()
    _assert_failed_cleanly(engine, handles, DeviceLost, "gone")
    assert not engine.core.by_id


def test_close_ends_requests_never_stepped_and_stats_answer_after_close():
    """Not a failure, the same guarantee: close() ends what a start=False engine never took in,
    and stats() answers once the loop is gone instead of blocking."""
    manual = _sim_engine(start=False)
    h = manual.submit([1, 2, 3], LONG)
    _bounded(manual.close)
    assert h.result(timeout=0).finish_reason == "cancelled"
    with pytest.raises(EngineClosedError):
        manual.submit([1, 2, 3], LONG)

    threaded = _sim_engine(start=True)
    done = threaded.generate([4, 5, 6], SamplingParams(temperature=0, max_tokens=4))
    assert done.finish_reason == "length"
    _bounded(threaded.close)
    stats, _ = _bounded(threaded.stats)
    assert stats["requests_finished"] == 1 and "failed" not in stats
