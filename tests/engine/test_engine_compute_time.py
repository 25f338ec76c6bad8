"""What the engine counts as model compute (`EngineCore.compute_seconds`, the base of the
control figure of `ninfer bench engine`): the Program's compiled steps only. Building a step's
inputs on the host is control work, so it is never counted as compute."""
import time

from engine_helpers import make_engine, run_until_done
from ninfer_jax import SamplingParams
from ninfer_jax.program.program import Program


def test_compute_seconds_is_the_programs_step_time(tiny_model):
    engine = make_engine(tiny_model)
    core, program = engine.core, engine.program
    base_core, base_steps = core.compute_seconds, program.step_seconds
    handles = [engine.submit(list(range(1, 40 + 9 * i)), SamplingParams(temperature=0, max_tokens=5))
               for i in range(3)]
    run_until_done(engine, handles)
    steps = program.step_seconds - base_steps
    assert steps > 0
    assert abs((core.compute_seconds - base_core) - steps) < 1e-9


class SlowInputs(Program):
    """A Program whose decode spends 0.2 s of host work before its compiled step."""

    def decode(self, rows):
        time.sleep(0.2)
        return super().decode(rows)


def test_host_work_outside_the_compiled_step_is_not_compute(tiny_model):
    engine = make_engine(tiny_model)
    engine.program.__class__ = SlowInputs
    h = engine.submit([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=4))
    base = engine.core.compute_seconds
    run_until_done(engine, [h], check_every_cycle=False)
    decodes = engine.core.counters["decode_steps"]
    assert decodes >= 3
    # Counting the host work would make compute at least 0.2 s per decode step.
    assert engine.core.compute_seconds - base < 0.2 * decodes / 2
