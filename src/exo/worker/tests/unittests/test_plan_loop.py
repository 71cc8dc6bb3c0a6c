"""Two nodes share an instance and one runner fails: the planners heal it without a
create -> shutdown -> create loop (seeds 000-002).

A small simulated cluster steps each node's planner and executes what it returns the
way a real worker would, emitting the events its runners would emit; every event goes
through ``apply`` in index order, and both nodes plan from the same state.
"""

from dataclasses import dataclass, field, replace
from itertools import pairwise

from exo.shared.apply import apply
from exo.shared.constants import EXO_MAX_INSTANCE_RETRIES
from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import (
    DONE,
    INSTANCE_1,
    NODE_A,
    NODE_B,
    RUNNER_A1,
    RUNNER_B1,
    pair_instance,
)
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeDownloadProgress,
    RunnerStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import (
    AbandonInstance,
    CancelTask,
    ConnectToGroup,
    CreateRunner,
    DownloadModel,
    LoadModel,
    Shutdown,
    StartWarmup,
    Task,
    TextGeneration,
)
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import (
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerId,
    RunnerIdle,
    RunnerLoaded,
    RunnerReady,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo.utils.backoff import KeyedBackoff
from exo.worker.plan import RunnerView, plan

DT = 0.25  # seconds between planning rounds


@dataclass
class Planned:
    at: float
    node_id: NodeId
    task: Task
    # Whether a sibling's RunnerFailed was in the state when this was planned.
    sibling_failed: bool


@dataclass
class SimNode:
    node_id: NodeId
    runners: dict[RunnerId, RunnerView] = field(default_factory=dict[RunnerId, RunnerView])
    instance_backoff: KeyedBackoff[InstanceId] = field(default_factory=KeyedBackoff[InstanceId])
    download_backoff: KeyedBackoff[ModelId] = field(default_factory=KeyedBackoff[ModelId])
    # Runners started but not yet reporting: the process is still booting.
    booting: list[RunnerId] = field(default_factory=list[RunnerId])
    # Make every runner of this node crash while loading.
    crash_on_load: bool = False


@dataclass
class Cluster:
    nodes: dict[NodeId, SimNode]
    state: State = field(default_factory=State)
    now: float = 0.0
    history: list[Planned] = field(default_factory=list[Planned])

    # --- the master: sequences events, everyone applies them ---------------------------

    def emit(self, *events: Event) -> None:
        for event in events:
            idx = self.state.last_event_applied_idx + 1
            self.state = apply(self.state, IndexedEvent(idx=idx, event=event))

    # --- runners: report their status through the supervisor --------------------------

    def report(self, node: SimNode, runner_id: RunnerId, status: RunnerStatus) -> None:
        node.runners[runner_id] = replace(node.runners[runner_id], status=status)
        self.emit(RunnerStatusUpdated(runner_id=runner_id, runner_status=status))

    def fail(self, node_id: NodeId, runner_id: RunnerId, message: str = "boom") -> None:
        self.report(self.nodes[node_id], runner_id, RunnerFailed(error_message=message))

    def settle(self) -> None:
        """What runner processes do on their own: finish booting, and complete the
        collective steps once every rank of the group has joined them."""
        for node in self.nodes.values():
            for runner_id in node.booting:
                if runner_id in node.runners:
                    self.report(node, runner_id, RunnerIdle())
            node.booting.clear()
        for instance in self.state.instances.values():
            ids = list(instance.shard_assignments.runner_to_shard)
            statuses = [self.state.runners.get(rid) for rid in ids]
            for waiting, done in [
                (RunnerConnecting, RunnerConnected()),
                (RunnerWarmingUp, RunnerReady()),
            ]:
                if all(isinstance(s, waiting) for s in statuses):
                    for rid in ids:
                        self.report(self._owner(rid), rid, done)

    def _owner(self, runner_id: RunnerId) -> SimNode:
        return next(n for n in self.nodes.values() if runner_id in n.runners)

    # --- a worker: plan, then execute ---------------------------------------------------

    def step(self, node_id: NodeId) -> Task | None:
        node = self.nodes[node_id]
        task = plan(
            node_id,
            node.runners,
            self.state,
            node.instance_backoff,
            node.download_backoff,
            self.now,
        )
        if task is not None:
            self.history.append(Planned(self.now, node_id, task, self._sibling_failed(node_id)))
            self._execute(node, task)
        return task

    def _sibling_failed(self, node_id: NodeId) -> bool:
        for instance in self.state.instances.values():
            mine = instance.shard_assignments.node_to_runner.get(node_id)
            for rid in instance.shard_assignments.runner_to_shard:
                if rid != mine and isinstance(self.state.runners.get(rid), RunnerFailed):
                    return True
        return False

    def _execute(self, node: SimNode, task: Task) -> None:
        match task:
            case CreateRunner():
                node.instance_backoff.record_attempt(task.instance_id, self.now)
                rid = task.bound_instance.bound_runner_id
                node.runners[rid] = RunnerView(bound_instance=task.bound_instance)
                node.booting.append(rid)
            case Shutdown():
                view = node.runners.pop(task.runner_id)
                if isinstance(view.status, RunnerFailed):
                    # The supervisor reports its own final status: failed stays failed.
                    self.emit(
                        RunnerStatusUpdated(runner_id=task.runner_id, runner_status=view.status)
                    )
                else:
                    self.emit(
                        RunnerStatusUpdated(
                            runner_id=task.runner_id, runner_status=RunnerShuttingDown()
                        ),
                        RunnerStatusUpdated(
                            runner_id=task.runner_id, runner_status=RunnerShutdown()
                        ),
                    )
            case DownloadModel():
                model_id = task.shard_metadata.model_card.model_id
                node.download_backoff.record_attempt(model_id, self.now)
                self.emit(
                    NodeDownloadProgress(node_id=node.node_id, model_id=model_id, progress=DONE)
                )
            case ConnectToGroup():
                self.report(node, self._local_runner(node, task.instance_id), RunnerConnecting())
            case LoadModel():
                rid = self._local_runner(node, task.instance_id)
                if node.crash_on_load:
                    self.report(node, rid, RunnerFailed(error_message="crashed while loading"))
                else:
                    self.report(node, rid, RunnerLoaded())
            case StartWarmup():
                self.report(node, self._local_runner(node, task.instance_id), RunnerWarmingUp())
            case AbandonInstance():
                # The master deletes the instance.
                self.emit(InstanceDeleted(instance_id=task.instance_id, reason=task.reason))
            case TextGeneration() | CancelTask():
                raise AssertionError(f"no requests in this scenario: {task}")

    @staticmethod
    def _local_runner(node: SimNode, instance_id: InstanceId) -> RunnerId:
        return next(
            rid
            for rid, view in node.runners.items()
            if view.bound_instance.instance.instance_id == instance_id
        )

    def round(self) -> None:
        for node_id in self.nodes:
            self.step(node_id)
        self.settle()
        self.now += DT

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.round()

    # --- reading the history ------------------------------------------------------------

    def planned(self, node_id: NodeId, kind: type, since: float = 0.0) -> list[Planned]:
        return [
            p
            for p in self.history
            if p.node_id == node_id and isinstance(p.task, kind) and p.at >= since
        ]

    def all_ready(self) -> bool:
        return self.state.runners == {RUNNER_A1: RunnerReady(), RUNNER_B1: RunnerReady()}


def _healthy_cluster() -> Cluster:
    cluster = Cluster(nodes={NODE_A: SimNode(NODE_A), NODE_B: SimNode(NODE_B)})
    cluster.emit(InstanceCreated(instance=pair_instance()))
    cluster.run(20)
    assert cluster.all_ready()
    assert len(cluster.planned(NODE_A, CreateRunner)) == 1
    assert len(cluster.planned(NODE_B, CreateRunner)) == 1
    return cluster


def test_instance_comes_up_and_stays_up() -> None:
    cluster = _healthy_cluster()
    quiet_since = cluster.now
    cluster.run(200)
    assert cluster.all_ready()
    assert [p for p in cluster.history if p.at >= quiet_since] == []


def test_failed_runner_is_rebuilt_first_then_its_peer_without_a_loop() -> None:
    cluster = _healthy_cluster()
    a, b = cluster.nodes[NODE_A], cluster.nodes[NODE_B]
    # Both runners were created at t=0: A may retry from t=1.
    cluster.now = 0.5
    cluster.fail(NODE_A, RUNNER_A1)
    failed_at = cluster.now

    # A shuts its dead runner down; its failure stays in the state.
    task = cluster.step(NODE_A)
    assert isinstance(task, Shutdown)
    assert (task.instance_id, task.runner_id) == (INSTANCE_1, RUNNER_A1)
    assert a.runners == {}
    assert isinstance(cluster.state.runners[RUNNER_A1], RunnerFailed)

    # B's sibling failed: B leaves the group, and RunnerShutdown removes its runner.
    task = cluster.step(NODE_B)
    assert isinstance(task, Shutdown)
    assert task.runner_id == RUNNER_B1
    assert b.runners == {}
    assert RUNNER_B1 not in cluster.state.runners

    # B must not come back while A's runner is failed; A waits out its backoff.
    for _ in range(3):
        assert cluster.step(NODE_B) is None
        assert cluster.step(NODE_A) is None
    cluster.now = 1.0
    assert cluster.step(NODE_B) is None
    task = cluster.step(NODE_A)
    assert isinstance(task, CreateRunner)
    assert task.bound_instance.bound_runner_id == RUNNER_A1

    # A's new runner is still booting: the state still says failed, B still waits.
    assert isinstance(cluster.state.runners[RUNNER_A1], RunnerFailed)
    assert cluster.step(NODE_B) is None
    assert cluster.step(NODE_A) is None

    # A's new runner reports RunnerIdle: now B creates.
    cluster.settle()
    assert cluster.state.runners[RUNNER_A1] == RunnerIdle()
    task = cluster.step(NODE_B)
    assert isinstance(task, CreateRunner)
    assert task.bound_instance.bound_runner_id == RUNNER_B1

    # And the instance heals, then stays healthy over many rounds.
    cluster.settle()
    cluster.run(400)
    assert cluster.all_ready()
    assert len(cluster.planned(NODE_B, CreateRunner, since=failed_at)) == 1
    assert len(cluster.planned(NODE_A, CreateRunner, since=failed_at)) == 1
    assert len(cluster.planned(NODE_B, Shutdown, since=failed_at)) == 1
    assert len(cluster.planned(NODE_A, Shutdown, since=failed_at)) == 1
    assert not any(p.sibling_failed for p in cluster.planned(NODE_B, CreateRunner))


def test_failure_found_in_any_round_order_heals_the_same_way() -> None:
    # Same scenario, but both planners just run in rounds (B may plan first, A's
    # backoff may still hold): B creates exactly once after the failure.
    for first in [NODE_A, NODE_B]:
        cluster = _healthy_cluster()
        if first == NODE_B:
            cluster.nodes = {NODE_B: cluster.nodes[NODE_B], NODE_A: cluster.nodes[NODE_A]}
        failed_at = cluster.now
        cluster.fail(NODE_A, RUNNER_A1)
        cluster.run(400)
        assert cluster.all_ready()
        assert len(cluster.planned(NODE_B, CreateRunner, since=failed_at)) == 1
        assert len(cluster.planned(NODE_A, CreateRunner, since=failed_at)) == 1
        assert not any(p.sibling_failed for p in cluster.planned(NODE_B, CreateRunner))


def test_peer_crashing_too_is_rebuilt_by_both() -> None:
    cluster = _healthy_cluster()
    failed_at = cluster.now
    cluster.fail(NODE_A, RUNNER_A1, "boom")
    cluster.fail(NODE_B, RUNNER_B1, "peer closed the connection")
    cluster.run(400)
    assert cluster.all_ready()
    assert len(cluster.planned(NODE_A, CreateRunner, since=failed_at)) == 1
    assert len(cluster.planned(NODE_B, CreateRunner, since=failed_at)) == 1


def test_runner_that_always_crashes_is_abandoned_after_max_retries() -> None:
    cluster = _healthy_cluster()
    cluster.nodes[NODE_A].crash_on_load = True
    failed_at = cluster.now
    cluster.fail(NODE_A, RUNNER_A1)
    cluster.run(400)

    # A rebuilt until its attempts ran out, then gave the instance up; the master
    # deleted it and B's runner went with it.
    a_creates = cluster.planned(NODE_A, CreateRunner)
    assert len(a_creates) == EXO_MAX_INSTANCE_RETRIES
    abandoned = cluster.planned(NODE_A, AbandonInstance)
    assert len(abandoned) == 1
    assert isinstance(abandoned[0].task, AbandonInstance)
    assert "crashed while loading" in abandoned[0].task.reason
    assert cluster.state.instances == {}
    assert cluster.state.runners == {}
    assert cluster.nodes[NODE_A].runners == {}
    assert cluster.nodes[NODE_B].runners == {}

    # A's retries were spaced out by its backoff: 1, 2, 4, 8 s at least.
    starts = [p.at for p in a_creates]
    gaps = [later - earlier for earlier, later in pairwise(starts)]
    assert all(gap >= 2**i for i, gap in enumerate(gaps)), gaps

    # B followed each rebuild once at most, never while A was failed, never afterwards.
    b_creates = cluster.planned(NODE_B, CreateRunner, since=failed_at)
    assert 1 <= len(b_creates) <= EXO_MAX_INSTANCE_RETRIES - 1
    assert not any(p.sibling_failed for p in b_creates)
    assert all(p.at < abandoned[0].at for p in b_creates)
    assert cluster.planned(NODE_B, AbandonInstance) == []
