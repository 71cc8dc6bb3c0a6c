"""What a request waiting for a model learns from the downloads in the state (pure)."""

from exo.api.download_wait import DownloadWatch
from exo.shared.tests.builders import (
    INSTANCE_1,
    MODEL_1,
    NODE_A,
    NODE_B,
    fold,
    make_state,
    pair_instance,
)
from exo.shared.types.events import InstanceCreated, InstanceDeleted, NodeDownloadProgress
from exo.shared.types.worker.downloads import DownloadFailed, DownloadOngoing


def _failed(status: int | None) -> NodeDownloadProgress:
    return NodeDownloadProgress(node_id=NODE_B, model_id=MODEL_1, progress=DownloadFailed(
        error_message="boom", status=status))


def test_a_terminal_failure_on_any_node_of_the_instance_ends_the_wait_with_its_status() -> None:
    state = fold(make_state(), [InstanceCreated(instance=pair_instance())])
    watch = DownloadWatch(MODEL_1)
    assert watch.observe(state, 0.0) is None
    state = fold(state, [_failed(403)])
    error = watch.observe(state, 0.1)
    assert error is not None and error.status == 403
    assert error.headers == {"x-should-retry": "false"}
    # Still known after the instance is gone (the worker deletes it).
    state = fold(state, [InstanceDeleted(instance_id=INSTANCE_1, reason="download failed")])
    assert watch.observe(state, 0.2) is not None


def test_a_transient_failure_ends_the_wait_after_the_limit_with_retry_after() -> None:
    state = fold(make_state(), [InstanceCreated(instance=pair_instance()), _failed(None)])
    watch = DownloadWatch(MODEL_1, transient_limit_s=30)
    assert watch.observe(state, 100.0) is None
    assert watch.observe(state, 129.0) is None
    # A retry that starts and fails again without a byte does not restart the clock.
    retry = NodeDownloadProgress(node_id=NODE_B, model_id=MODEL_1,
                                 progress=DownloadOngoing(downloaded_bytes=0, total_bytes=0))
    assert watch.observe(fold(state, [retry]), 129.5) is None
    error = watch.observe(state, 130.5)
    assert error is not None and error.status == 503 and error.headers["Retry-After"]


def test_bytes_flowing_again_restart_the_transient_clock() -> None:
    state = fold(make_state(), [InstanceCreated(instance=pair_instance()), _failed(None)])
    watch = DownloadWatch(MODEL_1, transient_limit_s=30)
    assert watch.observe(state, 100.0) is None
    moving = NodeDownloadProgress(node_id=NODE_B, model_id=MODEL_1,
                                  progress=DownloadOngoing(downloaded_bytes=5, total_bytes=9))
    assert watch.observe(fold(state, [moving]), 120.0) is None
    # Failing again starts a new 30 s from that failure.
    assert watch.observe(state, 131.0) is None
    assert watch.observe(state, 160.0) is None
    assert watch.observe(state, 161.5) is not None


def test_a_new_instance_forgets_failed_downloads_of_its_model_on_its_nodes() -> None:
    state = fold(make_state(), [_failed(404)])
    other = NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_1, progress=DownloadFailed(
        error_message="x", status=404))
    state = fold(state, [other, InstanceCreated(instance=pair_instance())])
    assert MODEL_1 not in state.downloads.get(NODE_A, {})
    assert MODEL_1 not in state.downloads.get(NODE_B, {})
    assert DownloadWatch(MODEL_1).observe(state, 0.0) is None
