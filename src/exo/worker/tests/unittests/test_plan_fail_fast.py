"""plan: a load that failed on the model's file is given up at once, not retried."""

from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import INSTANCE_1, NODE_A, RUNNER_A1, make_state, single_instance
from exo.shared.types.tasks import AbandonInstance, CreateRunner
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerFailed
from exo.utils.backoff import KeyedBackoff
from exo.worker.plan import plan

T0 = 1000.0


def _plan_after(failed: RunnerFailed) -> object:
    state = make_state(instances=[single_instance()], runners={RUNNER_A1: failed})
    backoff = KeyedBackoff[InstanceId]()
    backoff.record_attempt(INSTANCE_1, T0)
    return plan(NODE_A, {}, state, backoff, KeyedBackoff[ModelId](), T0 + 3600)


def test_a_deterministic_load_failure_abandons_the_instance_at_once() -> None:
    task = _plan_after(RunnerFailed(error_message="ValueError: no tensor x", deterministic=True))
    assert isinstance(task, AbandonInstance) and task.instance_id == INSTANCE_1
    assert "ValueError: no tensor x" in task.reason and "not retried" in task.reason


def test_any_other_failure_is_retried() -> None:
    assert isinstance(_plan_after(RunnerFailed(error_message="out of memory")), CreateRunner)
