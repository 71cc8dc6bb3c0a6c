"""A request's images encoded off the batch loop (issue 25: an image must not stall the others).

A vision tower takes long (a real Gemma 3 4B tower: about a minute on one core for one 896x896
image). `ImageJobs` runs each request's encoding in one worker thread, oldest first, while the
runner keeps stepping the running streams; torch releases the GIL inside its ops, so the two
proceed together. The thread sizes its torch pool as the runner's (torch hands each thread the
process's setting).

    jobs.add(batch, task_id, vision, images, ids, sampling)
                                  a request with images waits ("encoding") while `vision`
                                  encodes them; one without joins `batch` at once
    jobs.admit(batch)             the requests whose encoding ended join the batch; the ones
                                  whose encoding (or admission) failed are returned, each to
                                  fail alone
    jobs.drop(task_id)            cancelled: the result, when it comes, is thrown away
    jobs.wakeup                   a file descriptor that turns readable when a job finishes, so
                                  the runner blocks on its inputs and on this, never spins

The worker is a daemon thread: a runner that exits does not wait for a tower still running."""

import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from loguru import logger

from exo.shared.types.chunks import ErrorCode
from exo.shared.types.tasks import TaskId
from exo.shared.types.text_generation import InputImage
from exo.worker.engines.images import ImageSpans, VisionEncoder
from exo.worker.engines.sampling import SamplingParams
from exo.worker.runner.prompt_images import ImageError, encode_images

Encode = Callable[[], ImageSpans | None]


class Batch(Protocol):
    def add(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        images: ImageSpans | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class Refused:
    """A request whose images could not be encoded or admitted: why (an API error)."""

    task_id: TaskId
    message: str
    code: ErrorCode | None


@dataclass(frozen=True)
class Encoded:
    """One request's finished encoding: its spans, or why it failed."""

    task_id: TaskId
    spans: ImageSpans | None
    error: Exception | None = None


class ImageJobs:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[TaskId, Encode] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: set[TaskId] = set()  # started and not finished, dropped or taken
        self._done: list[Encoded] = []
        self._prompts: dict[TaskId, tuple[list[int], SamplingParams]] = {}  # runner thread
        self._pipe: tuple[int, int] | None = None  # made with the worker, by the first job
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def wakeup(self) -> int | None:
        """Readable when a job has finished (None before the first job)."""
        return None if self._pipe is None else self._pipe[0]

    @property
    def encoding(self) -> int:
        """Requests whose images are still being encoded."""
        with self._lock:
            return len(self._pending) - len(self._done)

    @property
    def ready(self) -> bool:
        """Some finished encodings wait for `finished()`."""
        with self._lock:
            return bool(self._done)

    @property
    def waiting(self) -> int:
        """Requests not in the batch yet: encoding, or encoded and not admitted."""
        return len(self._prompts)

    def add(
        self,
        batch: Batch,
        task_id: TaskId,
        vision: VisionEncoder | None,
        images: Sequence[InputImage],
        ids: Sequence[int],
        sampling: SamplingParams,
    ) -> None:
        """Encode a request's images (`encode_images`) in the worker; the request joins the
        batch with its prompt `ids` and `sampling` when they are ready (at once without)."""
        if not images:
            batch.add(task_id, list(ids), sampling)
            return
        ids = list(ids)
        images = list(images)
        self.run(task_id, lambda: encode_images(vision, ids, images), ids, sampling)

    def run(
        self, task_id: TaskId, encode: Encode, ids: list[int], sampling: SamplingParams
    ) -> None:
        if self._closed:
            raise RuntimeError("the image encoder is closed")
        with self._lock:
            if task_id in self._pending:
                raise ValueError(f"request {task_id} is already encoding")
            self._pending.add(task_id)
        if self._thread is None:
            self._pipe = os.pipe()
            os.set_blocking(self._pipe[0], False)
            self._thread = threading.Thread(target=self._work, name="image-encoder", daemon=True)
            self._thread.start()
        self._prompts[task_id] = (ids, sampling)
        self._queue.put((task_id, encode))

    def drop(self, task_id: TaskId) -> bool:
        """Forget a request's encoding (True if it had one): its result is discarded."""
        self._prompts.pop(task_id, None)
        with self._lock:
            if task_id not in self._pending:
                return False
            self._pending.discard(task_id)
            self._done = [d for d in self._done if d.task_id != task_id]
            return True

    def finished(self) -> list[Encoded]:
        """The encodings that ended since the last call, in the order they ended."""
        self._drain()
        with self._lock:
            done, self._done = self._done, []
            for d in done:
                self._pending.discard(d.task_id)
        return done

    def admit(self, batch: Batch) -> list[Refused]:
        """Add the encoded requests to `batch`; those that failed, to fail alone."""
        refused: list[Refused] = []
        for done in self.finished():
            prompt = self._prompts.pop(done.task_id, None)
            if prompt is None:
                continue  # dropped meanwhile
            try:
                if done.error is not None:
                    raise done.error
                batch.add(done.task_id, *prompt, done.spans)
            except ImageError as e:
                refused.append(Refused(done.task_id, str(e), "invalid_request"))
            except Exception as e:  # this request fails; the others go on
                logger.warning(f"request {done.task_id}: its images failed: {e}")
                refused.append(Refused(done.task_id, f"{type(e).__name__}: {e}", None))
        return refused

    def close(self) -> None:
        """Stop the worker after the job it runs (if any); queued jobs are dropped."""
        if self._closed:
            return
        self._closed = True
        self._prompts.clear()
        with self._lock:
            self._pending.clear()
            self._done.clear()
        self._queue.put(None)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            task_id, encode = job
            with self._lock:
                if task_id not in self._pending:
                    continue  # cancelled before its turn
            try:
                result = Encoded(task_id, encode())
            except Exception as e:  # the request's failure, reported by the runner thread
                result = Encoded(task_id, None, e)
            with self._lock:
                if task_id not in self._pending:
                    continue  # cancelled while encoding: dropped
                self._done.append(result)
            assert self._pipe is not None
            os.write(self._pipe[1], b"\0")

    def _drain(self) -> None:
        if self._pipe is None:
            return
        try:
            while os.read(self._pipe[0], 4096):
                pass
        except BlockingIOError:
            pass
