"""Answers cut in transit end with an error, never a hang or a silent hole (issue 13: a
Claude stream whose node was partitioned from the runner's node while it streamed waited
past its 60 s deadline in the chaos suite)."""

from exo.node.chunks import ChunkRouter
from exo.node.requests import LOST_TAIL, RequestTracker
from exo.shared.tests.builders import (
    COMMAND_1,
    MODEL_1,
    TASK_1,
    make_state,
    single_instance,
    text_generation,
)
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishReason, TokenChunk
from exo.shared.types.events import InstanceDeleted, TaskCreated, TaskStatusUpdated
from exo.shared.types.tasks import TaskStatus
from exo.utils.channels import Receiver


def token(idx: int, text: str = "x", finish: FinishReason | None = None) -> TokenChunk:
    return TokenChunk(model=MODEL_1, text=text, token_id=idx, idx=idx, finish_reason=finish)


def drain(receiver: Receiver[Chunk]) -> list[Chunk]:
    out: list[Chunk] = []
    while True:
        try:
            out.append(receiver.receive_nowait())
        except Exception:
            return out


def test_a_gap_in_the_chunk_numbers_ends_the_request_with_an_error() -> None:
    router = ChunkRouter()
    receiver = router.open(COMMAND_1)
    router.deliver(COMMAND_1, token(0, "a"))
    router.deliver(COMMAND_1, token(1, "b"))
    router.deliver(COMMAND_1, token(4, "e"))  # 2 and 3 were lost
    router.deliver(COMMAND_1, token(5, "f", "stop"))
    got = drain(receiver)
    assert [c.text for c in got if isinstance(c, TokenChunk)] == ["a", "b"]
    assert isinstance(got[-1], ErrorChunk)
    assert "2 part(s) of the answer were lost" in got[-1].error_message
    assert not router.is_open(COMMAND_1)


def test_a_repeated_chunk_is_dropped_and_the_answer_completes() -> None:
    router = ChunkRouter()
    receiver = router.open(COMMAND_1)
    for chunk in (token(0, "a"), token(0, "a"), token(1, "b", "stop")):
        router.deliver(COMMAND_1, chunk)
    got = drain(receiver)
    assert [c.text for c in got if isinstance(c, TokenChunk)] == ["a", "b"]
    assert got[-1].finish_reason == "stop"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def started(clock: Clock) -> tuple[RequestTracker, Receiver[Chunk]]:
    instance = single_instance()
    task = text_generation(command_id=COMMAND_1)
    tracker = RequestTracker(ChunkRouter(), clock=clock, tail_grace_s=5.0)
    receiver = tracker.open(COMMAND_1)
    state = make_state([instance], tasks=[task])
    tracker.observe(TaskCreated(task_id=TASK_1, task=task), state)
    return tracker, receiver


def test_a_finished_task_whose_last_chunk_never_comes_ends_with_an_error() -> None:
    clock = Clock()
    tracker, receiver = started(clock)
    tracker.chunks.deliver(COMMAND_1, token(0, "a"))
    # The task completed (a replicated event) but its final chunk was lost on a cut link.
    done = TaskStatusUpdated(task_id=TASK_1, task_status=TaskStatus.Complete)
    tracker.observe(done, make_state([single_instance()]))
    clock.now += 4.9
    tracker.expire()
    assert [type(c) for c in drain(receiver)] == [TokenChunk]  # still within the grace
    clock.now += 0.2
    tracker.expire()
    got = drain(receiver)
    assert len(got) == 1 and isinstance(got[0], ErrorChunk)
    assert got[0].error_message == LOST_TAIL
    assert not tracker.chunks.is_open(COMMAND_1)


def test_a_finished_task_whose_last_chunk_came_is_left_alone() -> None:
    clock = Clock()
    tracker, receiver = started(clock)
    done = TaskStatusUpdated(task_id=TASK_1, task_status=TaskStatus.Complete)
    tracker.observe(done, make_state([single_instance()]))
    tracker.chunks.deliver(COMMAND_1, token(0, "a", "stop"))  # the end comes after the event
    clock.now += 60
    tracker.expire()
    got = drain(receiver)
    assert [c.finish_reason for c in got] == ["stop"]


def test_an_instance_deleted_before_the_answer_ends_the_request_at_once() -> None:
    clock = Clock()
    tracker, receiver = started(clock)
    gone = InstanceDeleted(instance_id=single_instance().instance_id, reason="runner died")
    tracker.observe(gone, make_state())
    got = drain(receiver)
    assert len(got) == 1 and isinstance(got[0], ErrorChunk)
    assert "runner died" in got[0].error_message
