"""One model worker: a single thread runs every model call, in arrival order (one accelerator
serves one request at a time, and the policies are not thread-safe). Callers wait on futures.

The queue is bounded: when it is full a request is refused at once (`QueueFull`, HTTP 503)
instead of waiting behind work the server cannot finish in time.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable


class QueueFull(Exception):
    pass


@dataclass(frozen=True)
class Done:
    value: Any  # what the job returned
    queue_ms: float  # submitted -> started
    run_ms: float  # started -> finished


class ModelWorker:
    def __init__(self, max_queue: int):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self._jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._loop, name="heisd-model-worker", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting (not the one running)."""
        return self._jobs.qsize()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Queue `fn`; the future's result is a `Done`, or the exception `fn` raised."""
        future: Future = Future()
        try:
            self._jobs.put_nowait((fn, future, time.perf_counter()))
        except queue.Full:
            raise QueueFull(f"the model queue is full ({self.max_queue} waiting; serve --queue-size)") from None
        return future

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued jobs, then stop the thread."""
        self._jobs.put((None, None, 0.0))  # blocks while full: queued work is not dropped
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            fn, future, submitted = self._jobs.get()
            if fn is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            try:
                value = fn()
            except BaseException as err:  # handed to the waiting request, which answers 4xx/5xx
                future.set_exception(err)
            else:
                future.set_result(Done(value, (started - submitted) * 1e3, (time.perf_counter() - started) * 1e3))
