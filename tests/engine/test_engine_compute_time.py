"""What the engine counts as model compute (`EngineCore.compute_seconds`, the base of the
control figure of `ninfer bench engine`): the Program's compiled steps only. Building a step's
inputs on the host is control work, so it is never counted as compute.

The Program here runs on a fake clock (no wall time is read or asserted on): each compiled call
advances it by STEP, each decode's input building by HOST, so every figure is exact."""
from engine_helpers import make_engine, run_until_done
from ninfer_jax import SamplingParams
from ninfer_jax.program.program import Program

STEP = 1.0  # fake seconds a compiled step takes
HOST = 0.25  # fake seconds of host work before a decode's compiled step


class FakeClockProgram(Program):
    """A real Program whose clock advances only by what the test says each part costs."""

    now = 0.0

    def clock(self) -> float:
        return self.now

    def _run(self, kind, *args, **kw):
        out = super()._run(kind, *args, **kw)
        self.now += STEP
        return out

    def decode(self, rows):
        self.now += HOST  # padding, page tables: host work outside the compiled step
        return super().decode(rows)


def _fake_clock_engine(tiny_model):
    engine = make_engine(tiny_model)
    engine.program.__class__ = FakeClockProgram
    return engine


def test_compute_seconds_is_the_programs_step_time(tiny_model):
    engine = _fake_clock_engine(tiny_model)
    core, program = engine.core, engine.program
    base_core, base_steps = core.compute_seconds, program.step_seconds
    base_calls = core.counters["decode_steps"] + core.counters["prefill_chunks"]
    handles = [engine.submit(list(range(1, 40 + 9 * i)), SamplingParams(temperature=0, max_tokens=5))
               for i in range(3)]
    run_until_done(engine, handles)
    calls = core.counters["decode_steps"] + core.counters["prefill_chunks"] - base_calls
    steps = program.step_seconds - base_steps
    assert calls > 0 and steps == calls * STEP
    assert core.compute_seconds - base_core == steps


def test_host_work_outside_the_compiled_step_is_not_compute(tiny_model):
    engine = _fake_clock_engine(tiny_model)
    core = engine.core
    h = engine.submit([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=4))
    base = core.compute_seconds
    base_calls = core.counters["decode_steps"] + core.counters["prefill_chunks"]
    run_until_done(engine, [h], check_every_cycle=False)
    decodes = core.counters["decode_steps"]
    assert decodes >= 3
    calls = decodes + core.counters["prefill_chunks"] - base_calls
    # Counting the host work would add HOST per decode step.
    assert core.compute_seconds - base == calls * STEP
