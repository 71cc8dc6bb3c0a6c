"""Channels: in-process (anyio memory streams) and across a real spawned process (pipes).

Every wait is bounded by a deadline; nothing sleeps.
"""

import multiprocessing as mp
import os
import pickle
import threading
import time
from multiprocessing.reduction import ForkingPickler

import anyio
import anyio.lowlevel
import pytest

from exo.utils.channels import MpReceiver, MpSender, channel, mp_channel, mp_wait

DEADLINE_S = 20.0
_SPAWN = mp.get_context("spawn")


# --- children (module level, so a spawned process can import them) ---------------------


def _echo_until_end(inbox: MpReceiver[object], outbox: MpSender[object]) -> None:
    """Send back everything received, in order; close once the inbox ends."""
    while True:
        try:
            item = inbox.receive()
        except anyio.EndOfStream:
            break
        outbox.send(item)
    outbox.close()


def _send_after_go(go: MpReceiver[int], outbox: MpSender[int]) -> None:
    """Wait for the parent's go, send one item, close."""
    outbox.send(go.receive())
    outbox.close()


def _send_then_hang(outbox: MpSender[int], hold: MpReceiver[int]) -> None:
    """Send two items, then block until killed (``hold`` never gets anything)."""
    outbox.send(1)
    outbox.send(2)
    hold.receive()


# --- in-process ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_items_arrive_in_order() -> None:
    sender, receiver = channel[int]()
    with anyio.fail_after(DEADLINE_S):
        for i in range(5):
            await sender.send(i)
        sender.send_nowait(5)
        assert [await receiver.receive() for _ in range(5)] == [0, 1, 2, 3, 4]
        assert receiver.receive_nowait() == 5


@pytest.mark.asyncio
async def test_async_for_ends_after_every_sender_closed() -> None:
    sender, receiver = channel[str]()
    other = sender.clone()
    received: list[str] = []

    async def consume() -> None:
        async for item in receiver:
            received.append(item)

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await sender.send("a")
            sender.close()  # one sender left: the stream goes on
            await other.send("b")
            await other.aclose()
    assert received == ["a", "b"]


@pytest.mark.asyncio
async def test_receive_after_senders_closed_ends_the_stream() -> None:
    sender, receiver = channel[int]()
    await sender.send(1)
    sender.close()
    with anyio.fail_after(DEADLINE_S):
        assert await receiver.receive() == 1  # buffered items still arrive
        with pytest.raises(anyio.EndOfStream):
            await receiver.receive()


@pytest.mark.asyncio
async def test_send_after_receiver_closed_raises_closed_resource() -> None:
    sender, receiver = channel[int]()
    receiver.close()
    with anyio.fail_after(DEADLINE_S):
        with pytest.raises(anyio.ClosedResourceError):
            await sender.send(1)
        with pytest.raises(anyio.ClosedResourceError):
            sender.send_nowait(1)


@pytest.mark.asyncio
async def test_send_after_every_receiver_closed_raises_closed_resource() -> None:
    sender, receiver = channel[int]()
    clone = receiver.clone()
    receiver.close()
    await sender.send(1)  # the clone still listens
    assert clone.receive_nowait() == 1
    await clone.aclose()
    with pytest.raises(anyio.ClosedResourceError):
        await sender.send(2)


@pytest.mark.asyncio
async def test_bounded_channel_blocks_the_sender_until_received() -> None:
    sender, receiver = channel[int](1)
    sender.send_nowait(1)
    with pytest.raises(anyio.WouldBlock):
        sender.send_nowait(2)
    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sender.send, 2)  # waits for room
            assert await receiver.receive() == 1
            assert await receiver.receive() == 2


@pytest.mark.asyncio
async def test_send_with_room_and_receive_of_a_waiting_item_take_no_loop_turn() -> None:
    """A streamed token crosses channels in the node: anyio's send and receive each yield to
    the event loop first, a loop turn a hop a token. Ours hand over at once when they can;
    only a full buffer or an empty stream waits."""
    sender, receiver = channel[int]()
    turns = 0

    async def count_turns() -> None:  # runs once every loop turn
        nonlocal turns
        while True:
            turns += 1
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(count_turns)
            while turns == 0:
                await anyio.lowlevel.checkpoint()
            before = turns
            for i in range(10):
                await sender.send(i)
            got = [await receiver.receive() for _ in range(10)]
            assert turns == before
            assert got == list(range(10))
            tg.start_soon(sender.send, 10)  # an empty stream still waits for the item
            assert await receiver.receive() == 10
            assert turns > before
            tg.cancel_scope.cancel()


# --- across processes: same process first ----------------------------------------------


@pytest.mark.asyncio
async def test_mp_channel_in_one_process() -> None:
    sender, receiver = mp_channel[dict[str, int]]()
    assert not receiver.poll()
    sender.send({"a": 1})
    await sender.send_async({"b": 2})
    with anyio.fail_after(DEADLINE_S):
        assert receiver.poll(DEADLINE_S)
        assert receiver.receive() == {"a": 1}
        assert await receiver.receive_async() == {"b": 2}
        sender.close()
        sender.close()  # closing twice is fine
        with pytest.raises(anyio.EndOfStream):
            await receiver.receive_async()


def test_mp_poll_waits_for_an_item_and_sees_the_end() -> None:
    """poll(timeout) waits for an item another thread sends; once the sender closed, the end of
    the stream reads as ready (receive then says so), and polling again keeps saying so."""
    sender, receiver = mp_channel[int]()
    assert not receiver.poll()
    thread = threading.Thread(target=sender.send, args=(7,))
    thread.start()
    assert receiver.poll(DEADLINE_S)
    thread.join()
    assert receiver.receive() == 7
    assert not receiver.poll()
    sender.close()
    assert receiver.poll(DEADLINE_S) and receiver.poll()
    with pytest.raises(anyio.EndOfStream):
        receiver.receive()
    receiver.close()
    assert not receiver.poll()


def test_mp_send_after_own_close_raises_closed_resource() -> None:
    sender, receiver = mp_channel[int]()
    sender.close()
    with pytest.raises(anyio.ClosedResourceError):
        sender.send(1)
    receiver.close()


def test_mp_send_after_receiver_closed_raises_closed_resource() -> None:
    sender, receiver = mp_channel[int]()
    receiver.close()
    with pytest.raises(anyio.ClosedResourceError):
        sender.send(1)
    sender.close()  # the reader is gone: closing is still fine


@pytest.mark.asyncio
async def test_mp_receive_on_closed_receiver_raises_closed_resource() -> None:
    sender, receiver = mp_channel[int]()
    receiver.close()
    with pytest.raises(anyio.ClosedResourceError):
        receiver.receive()
    with pytest.raises(anyio.ClosedResourceError):
        await receiver.receive_async()
    assert not receiver.poll()
    sender.close()


def test_mp_sender_and_receiver_pickle_for_another_process() -> None:
    # multiprocessing pickles process arguments with ForkingPickler, which duplicates
    # the pipe's descriptor; the copies work and carry a fresh lock.
    sender, receiver = mp_channel[str]()
    sender_copy: MpSender[str] = pickle.loads(ForkingPickler.dumps(sender))
    receiver_copy: MpReceiver[str] = pickle.loads(ForkingPickler.dumps(receiver))
    assert sender_copy._lock is not sender._lock
    assert not sender_copy._lock.locked()
    sender_copy.send("via the copy")
    assert receiver_copy.receive() == "via the copy"
    sender.send("via the original")
    assert receiver.receive() == "via the original"
    for end in (sender, sender_copy):
        end.close()
    for end in (receiver, receiver_copy):
        end.close()


def test_mp_wait_reports_which_receivers_are_ready() -> None:
    first_sender, first = mp_channel[int]()
    second_sender, second = mp_channel[int]()
    third_sender, third = mp_channel[int]()
    assert mp_wait([first, second, third], 0) == []
    second_sender.send(2)
    assert mp_wait([first, second, third], DEADLINE_S) == [1]
    # The end of a stream is something to read, too.
    third_sender.close()
    assert mp_wait([first, second, third], DEADLINE_S) == [1, 2]
    # Closed receivers are skipped; the indexes stay those of the list given.
    first.close()
    assert mp_wait([first, second, third], 0) == [1, 2]
    assert mp_wait([first], 0) == []
    assert second.receive() == 2
    with pytest.raises(anyio.EndOfStream):
        third.receive()
    for sender in (first_sender, second_sender):
        sender.close()


@pytest.mark.asyncio
async def test_send_many_is_one_message_read_item_by_item_in_order() -> None:
    sender, receiver = mp_channel[int]()
    other_sender, other = mp_channel[int]()
    sender.send_many([1, 2, 3])
    sender.send_many([])  # nothing
    sender.send_many([4])
    sender.send(5)
    with anyio.fail_after(DEADLINE_S):
        assert receiver.receive() == 1
        # 2 and 3 came with 1 (the pipe holds only the next messages): still ready at once
        assert receiver.poll() and mp_wait([other, receiver], 0) == [1]
        assert [receiver.receive(), await receiver.receive_async()] == [2, 3]
        assert [receiver.receive() for _ in range(2)] == [4, 5]
        assert not receiver.poll()
        sender.close()
        with pytest.raises(anyio.EndOfStream):
            receiver.receive()
    other_sender.close()


# --- across a real spawned process ----------------------------------------------------


@pytest.mark.asyncio
async def test_items_cross_a_spawned_process_in_order_until_it_closes() -> None:
    to_child, inbox = mp_channel[object]()
    outbox, from_child = mp_channel[object]()
    child = _SPAWN.Process(target=_echo_until_end, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        # The child holds its own ends now.
        inbox.close()
        del outbox
        items: list[object] = [*range(200), "text", {"nested": [1, 2]}, b"x" * 1_000_000]
        received: list[object] = []
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:

                async def feed() -> None:
                    for item in items:
                        await to_child.send_async(item)
                    to_child.close()  # the child's inbox ends, so it closes its outbox

                tg.start_soon(feed)
                async for item in from_child:  # uses receive_async
                    received.append(item)
        assert received == items
        await anyio.to_thread.run_sync(child.join, DEADLINE_S)
        assert child.exitcode == 0
    finally:
        child.kill()
        child.join(DEADLINE_S)


@pytest.mark.asyncio
async def test_parent_closing_its_copy_does_not_end_the_childs_stream() -> None:
    # The supervisor's pattern: hand the sender to the child, then close this process's
    # copy, so that the child's death shows as the end of the stream.
    go_sender, go = mp_channel[int]()
    outbox, from_child = mp_channel[int]()
    child = _SPAWN.Process(target=_send_after_go, args=(go, outbox), daemon=True)
    child.start()
    try:
        outbox.close()
        go.close()
        go_sender.send(42)
        with anyio.fail_after(DEADLINE_S):
            assert await from_child.receive_async() == 42
            with pytest.raises(anyio.EndOfStream):
                await from_child.receive_async()
        await anyio.to_thread.run_sync(child.join, DEADLINE_S)
        assert child.exitcode == 0
    finally:
        child.kill()
        child.join(DEADLINE_S)
        go_sender.close()


@pytest.mark.asyncio
async def test_reader_sees_the_end_when_the_child_dies() -> None:
    outbox, from_child = mp_channel[int]()
    hold_sender, hold = mp_channel[int]()
    child = _SPAWN.Process(target=_send_then_hang, args=(outbox, hold), daemon=True)
    child.start()
    try:
        # Close this process's copy: then only the child keeps the pipe open.
        outbox.close()
        hold.close()
        with anyio.fail_after(DEADLINE_S):
            assert await from_child.receive_async() == 1
            assert await from_child.receive_async() == 2
            child.kill()
            with pytest.raises(anyio.EndOfStream):
                await from_child.receive_async()
        await anyio.to_thread.run_sync(child.join, DEADLINE_S)
        assert child.exitcode is not None and child.exitcode < 0
    finally:
        child.kill()
        child.join(DEADLINE_S)
        hold_sender.close()


def test_mp_wait_wakes_on_a_file_descriptor_without_reporting_it() -> None:
    sender, receiver = mp_channel[int]()
    read_fd, write_fd = os.pipe()
    try:
        assert mp_wait([receiver], 0, (read_fd,)) == []
        os.write(write_fd, b"\0")
        started = time.monotonic()
        assert mp_wait([receiver], DEADLINE_S, (read_fd,)) == []  # woken, nothing to receive
        assert time.monotonic() - started < DEADLINE_S
        sender.send(1)
        assert mp_wait([receiver], DEADLINE_S, (read_fd,)) == [0]
    finally:
        os.close(read_fd)
        os.close(write_fd)
        sender.close()
        receiver.close()
