"""plan with injected time: runner re-creation is backed off and bounded."""

from exo.shared.constants import EXO_MAX_INSTANCE_RETRIES
from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import (
    INSTANCE_1,
    INSTANCE_2,
    MODEL_2,
    NODE_A,
    NODE_B,
    RUNNER_A1,
    RUNNER_A2,
    bound,
    make_state,
    pair_instance,
    single_instance,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import AbandonInstance, CreateRunner, Task
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerFailed
from exo.utils.backoff import KeyedBackoff
from exo.worker.plan import RunnerView, plan

T0 = 1000.0
EPS = 1e-6


def _plan_a(state: State, backoff: KeyedBackoff[InstanceId], now: float) -> Task | None:
    """Plan for NODE_A, which has no runner of its own (it failed and was shut down)."""
    return plan(NODE_A, {}, state, backoff, KeyedBackoff[ModelId](), now)


def _failed_state(message: str = "boom") -> State:
    return make_state(
        instances=[single_instance()], runners={RUNNER_A1: RunnerFailed(error_message=message)}
    )


def test_max_retries_is_five() -> None:
    assert EXO_MAX_INSTANCE_RETRIES == 5


def test_no_create_before_the_delay_one_after() -> None:
    backoff = KeyedBackoff[InstanceId]()
    state = _failed_state()
    assert isinstance(_plan_a(state, backoff, T0), CreateRunner)
    backoff.record_attempt(INSTANCE_1, T0)
    # The runner failed at once: wait out the delay.
    assert _plan_a(state, backoff, T0) is None
    assert _plan_a(state, backoff, T0 + 1.0 - EPS) is None
    assert isinstance(_plan_a(state, backoff, T0 + 1.0), CreateRunner)


def test_delays_grow_then_the_instance_is_abandoned() -> None:
    backoff = KeyedBackoff[InstanceId]()
    state = _failed_state("CUDA out of memory")
    now = T0
    created_at: list[float] = []
    for expected_delay in [0.0, 1.0, 2.0, 4.0, 8.0]:
        allowed = now + expected_delay
        if expected_delay:
            assert _plan_a(state, backoff, allowed - EPS) is None
        assert isinstance(_plan_a(state, backoff, allowed), CreateRunner)
        backoff.record_attempt(INSTANCE_1, allowed)
        created_at.append(allowed)
        now = allowed
    assert len(created_at) == EXO_MAX_INSTANCE_RETRIES
    assert backoff.attempts(INSTANCE_1) == EXO_MAX_INSTANCE_RETRIES

    task = _plan_a(state, backoff, now)
    assert isinstance(task, AbandonInstance)
    assert task.instance_id == INSTANCE_1
    assert "5 times" in task.reason
    assert "CUDA out of memory" in task.reason
    # Never a CreateRunner again, however long we wait.
    for later in [now + 1, now + 30, now + 3600, now + 1e9]:
        assert isinstance(_plan_a(state, backoff, later), AbandonInstance)


def test_abandon_reason_without_a_failed_status() -> None:
    # The runner is gone from the state altogether (e.g. it was shut down): still abandoned.
    backoff = KeyedBackoff[InstanceId]()
    for i in range(EXO_MAX_INSTANCE_RETRIES):
        backoff.record_attempt(INSTANCE_1, T0 + i * 100)
    task = _plan_a(make_state(instances=[single_instance()]), backoff, T0 + 1e6)
    assert isinstance(task, AbandonInstance)
    assert task.reason == "runner failed 5 times"


def test_abandon_only_once_no_runner_of_ours_lives() -> None:
    # Five attempts, but the fifth runner is alive: nothing to abandon.
    backoff = KeyedBackoff[InstanceId]()
    for i in range(EXO_MAX_INSTANCE_RETRIES):
        backoff.record_attempt(INSTANCE_1, T0 + i)
    instance = single_instance()
    view = RunnerView(bound_instance=bound(instance, NODE_A))
    state = make_state(instances=[instance])
    task = plan(NODE_A, {RUNNER_A1: view}, state, backoff, KeyedBackoff[ModelId](), T0 + 100)
    assert not isinstance(task, (AbandonInstance, CreateRunner))


def test_backoff_is_per_instance() -> None:
    backoff = KeyedBackoff[InstanceId]()
    backoff.record_attempt(INSTANCE_1, T0)
    other = single_instance(INSTANCE_2, NODE_A, RUNNER_A2, MODEL_2)
    state = make_state(instances=[single_instance(), other])
    task = _plan_a(state, backoff, T0 + 0.5)
    assert isinstance(task, CreateRunner)
    assert task.instance_id == INSTANCE_2


def test_peer_waiting_for_a_failed_runner_does_not_abandon() -> None:
    # NODE_B used up its attempts, but it is waiting for NODE_A's failed runner: the
    # failed node decides, not its peers.
    backoff = KeyedBackoff[InstanceId]()
    for i in range(EXO_MAX_INSTANCE_RETRIES):
        backoff.record_attempt(INSTANCE_1, T0 + i)
    state = make_state(
        instances=[pair_instance()], runners={RUNNER_A1: RunnerFailed(error_message="x")}
    )
    assert plan(NODE_B, {}, state, backoff, KeyedBackoff[ModelId](), T0 + 1e6) is None
