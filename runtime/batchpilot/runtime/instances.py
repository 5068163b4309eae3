"""Model instances, each on a thread of its own: what the onnxruntime and PyTorch engines share.

An engine with N instances (sessions, or CUDA streams over one module) runs up to N batches at
once. Each instance has a single-thread executor, so one instance never runs two batches side by
side; a call that finds every instance busy waits for one (the engine contract: queue, never
fail). A cancelled call leaves its thread finishing the batch, and the next call on that instance
queues behind it on the same thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

H = TypeVar("H")
R = TypeVar("R")


_on_threads = 0
"""Calls running on instance threads now, every engine's (`running_on_threads`)."""
_on_threads_lock = threading.Lock()


def running_on_threads() -> int:
    """Engine calls running on instance threads now: at exit, a call that never ends (a GPU
    that hangs) would hold the interpreter, which joins these threads, for ever."""
    return _on_threads


def _counted(call: Callable[[H], R]) -> Callable[[H], R]:
    def counted(handle: H) -> R:
        global _on_threads
        with _on_threads_lock:
            _on_threads += 1
        try:
            return call(handle)
        finally:
            with _on_threads_lock:
                _on_threads -= 1

    return counted


class Instances(Generic[H]):
    """One handle per instance (a session, a stream), each with its executor thread."""

    def __init__(self, handles: Sequence[H], *, thread_name: str) -> None:
        if not handles:
            raise ValueError("an engine needs at least one instance")
        self._handles = list(handles)
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{thread_name}-{i}")
            for i in range(len(self._handles))
        ]
        self._free: asyncio.Queue[int] = asyncio.Queue()
        for index in range(len(self._handles)):
            self._free.put_nowait(index)

    def __len__(self) -> int:
        return len(self._handles)

    @property
    def handles(self) -> list[H]:
        return list(self._handles)

    async def run(self, call: Callable[[H], R]) -> R:
        """`call(handle)` on a free instance's thread; with all of them busy, wait for one."""
        index = await self._free.get()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executors[index], _counted(call), self._handles[index]
            )
        finally:
            self._free.put_nowait(index)

    async def run_timed(self, call: Callable[[H], R]) -> tuple[R, float]:
        """`run`, with the seconds `call` took on its thread (neither the wait for an instance
        nor the event loop's delay in taking the result back)."""

        def timed(handle: H) -> tuple[R, float]:
            started = time.perf_counter()
            result = call(handle)
            return result, time.perf_counter() - started

        return await self.run(timed)

    def close(self) -> None:
        """Let the threads go once their calls end, without waiting for them: a call that
        never ends (a GPU that hangs) held the event loop here, and the process never exited
        on SIGTERM — every rollout of a hung replica ended in SIGKILL."""
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)
