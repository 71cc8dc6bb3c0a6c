"""A level-triggered wake-up flag for loops that react to "something changed"."""

import anyio


class Wakeup:
    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float | None = None) -> None:
        """Return once set (and clear it), or after ``timeout`` seconds."""
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await self._event.wait()
        if self._event.is_set():
            self._event = anyio.Event()
