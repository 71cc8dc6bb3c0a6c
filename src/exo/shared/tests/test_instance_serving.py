"""The pure predicate the master, the API and the planner share: is an instance serving?"""

import pytest

from exo.shared.tests.builders import RUNNER_A1, RUNNER_B1, pair_instance
from exo.shared.types.worker.instances import instance_is_serving
from exo.shared.types.worker.runners import (
    RunnerFailed,
    RunnerLoaded,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
    RunnerWarmingUp,
)


@pytest.mark.parametrize("status", [RunnerReady(), RunnerRunning()])
def test_an_instance_whose_runners_all_take_requests_is_serving(status: RunnerStatus) -> None:
    instance = pair_instance()
    assert instance_is_serving(instance, {RUNNER_A1: status, RUNNER_B1: RunnerReady()})


@pytest.mark.parametrize(
    "status", [RunnerLoaded(), RunnerWarmingUp(), RunnerFailed(error_message="boom")]
)
def test_one_runner_not_ready_means_not_serving(status: RunnerStatus) -> None:
    instance = pair_instance()
    assert not instance_is_serving(instance, {RUNNER_A1: RunnerReady(), RUNNER_B1: status})


def test_a_runner_missing_from_state_means_not_serving() -> None:
    assert not instance_is_serving(pair_instance(), {RUNNER_A1: RunnerReady()})
