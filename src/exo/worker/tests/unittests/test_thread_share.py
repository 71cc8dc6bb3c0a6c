"""A node's threads split among its runners: never more than the budget in total."""

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.state import State
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerId
from exo.worker.tests.unittests.conftest import get_bound_mlx_ring_instance
from exo.worker.thread_share import local_runner_count, threads_for_new_runner


def test_one_runner_gets_the_whole_budget() -> None:
    assert threads_for_new_runner(16, [], 1) == 16


def test_runners_placed_together_split_the_budget_evenly() -> None:
    live: list[int] = []
    for _ in range(4):
        live.append(threads_for_new_runner(16, live, 4))
    assert live == [4, 4, 4, 4]


def test_a_later_runner_gets_only_what_is_free() -> None:
    assert threads_for_new_runner(16, [16], 2) == 1  # placed alone, took every core (logged)
    assert threads_for_new_runner(16, [6], 2) == 8
    assert threads_for_new_runner(16, [6, 8], 3) == 2
    live: list[int] = []  # three runners expected, on 7 threads: the sum stays within 7
    for _ in range(3):
        live.append(threads_for_new_runner(7, live, 3))
    assert live == [2, 2, 2]


def test_more_runners_than_threads_still_get_one_each() -> None:
    assert threads_for_new_runner(2, [], 5) == 1


def test_runners_hosted_here_are_counted_from_the_state() -> None:
    here, there = NodeId(), NodeId()
    instances = {}
    for node in (here, here, there):
        iid = InstanceId()
        bound = get_bound_mlx_ring_instance(iid, ModelId("m"), RunnerId(), node)
        instances[iid] = bound.instance
    state = State(instances=instances)
    assert local_runner_count(state, here) == 2
    assert local_runner_count(state, there) == 1
    assert local_runner_count(state, NodeId()) == 0
