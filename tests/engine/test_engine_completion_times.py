"""OBS-2/OBS-4 on `Completion`: first admission, first token, completion time and the largest
inter-token gap, measured from submission on the Program's clock (modelled on SimProgram)."""
from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
from ninfer_jax.sim import SimProgram


def _engine():
    cfg = EngineConfig(max_concurrency=1, max_context=256, chunk_size=32, progress=False,
                       context_cache=ContextCacheConfig(host_capacity_bytes=1 << 10))
    return Engine(cfg, program=SimProgram(cfg), start=False)


def test_obs4_completion_carries_admission_first_token_finish_and_max_gap():
    engine = _engine()
    first = engine.submit(list(range(1, 80)), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    second = engine.submit(list(range(2, 40)), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while not (first.done() and second.done()):
        engine.step()
    a, b = first.result(timeout=0), second.result(timeout=0)
    for c in (a, b):
        assert 0 <= c.admitted_s <= c.ttft_s <= c.completion_s, c
    # One lane: the second request is admitted only after the first finished (queueing counts).
    assert b.admitted_s >= a.completion_s
    # Six tokens: five gaps, the largest one reported; one token: no gap at all.
    assert 0 < a.max_output_gap_s <= a.completion_s - a.ttft_s
    assert b.max_output_gap_s is None
    engine.check_integrity()


def test_obs2_a_request_cancelled_in_the_queue_was_never_admitted():
    engine = _engine()
    running = engine.submit(list(range(1, 50)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    queued = engine.submit(list(range(3, 30)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()
    queued.cancel()
    while not (running.done() and queued.done()):
        engine.step()
    c = queued.result(timeout=0)
    assert c.finish_reason == "cancelled"
    assert c.admitted_s is None and c.ttft_s is None and c.max_output_gap_s is None
    assert c.completion_s is not None and c.completion_s >= 0
