"""RES-4 in one place (ledger/driver.py `plan_with_reclaim`), the loop the engine's
`ContextCache.retry` and `CacheSim` both run: a shortfall is reclaimed for and the plan made
again at once; any other refusal, or a reclamation that frees nothing, is the answer."""
import immutables

from ledger.driver import MAX_RETRIES, plan_with_reclaim
from ledger.plan import Refusal, Shortfall
from ledger.state import MAIN_KV

SHORT = Refusal("shortfall", Shortfall(immutables.Map({MAIN_KV: 3})))


def _planner(answers):
    made = []

    def make():
        made.append(len(made))
        return answers[min(len(made) - 1, len(answers) - 1)]
    return make, made


def test_res_4_a_reclaimed_shortfall_is_planned_again_at_once():
    make, made = _planner([SHORT, SHORT, "plan"])
    asked = []
    got = plan_with_reclaim(make, lambda pools: asked.append(pools) or True)
    assert got == "plan" and len(made) == 3
    assert asked == [{MAIN_KV: 3}, {MAIN_KV: 3}]  # the missing units, as a plain dict


def test_res_4_nothing_reclaimed_or_another_refusal_is_the_answer():
    make, made = _planner([SHORT, "plan"])
    assert plan_with_reclaim(make, lambda pools: False) is SHORT and len(made) == 1
    busy = Refusal("transaction_busy")
    make, made = _planner([busy, "plan"])
    assert plan_with_reclaim(make, lambda pools: True) is busy and len(made) == 1


def test_res_4_gives_up_after_max_retries():
    make, made = _planner([SHORT])
    asked = []
    assert plan_with_reclaim(make, lambda pools: asked.append(pools) or True) is SHORT
    assert len(asked) == MAX_RETRIES and len(made) == MAX_RETRIES + 1
