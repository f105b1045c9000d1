"""Where a command's independent jobs run: in this process (or a local process pool), or on a Ray
cluster (`--ray`). Eval, bench, demos, DAgger's rollouts, replay and build-datastore hand their jobs
(an episode, a demonstration episode to encode) to one of these; the driver alone writes outputs.

A job runs as `work(state, job)` on a worker whose `state` was built once by `setup()` (the target,
the policies, the environment's caches): both are module-level functions or `functools.partial`s of
them, so they travel to other processes and machines. Results come back as `(job, result)`, in job
order (`ordered=True`: files written in a fixed order) or as they finish (episode lines, which
carry their own task and index).

Ray workers are actors, one per `RayOptions.cpus_per_worker` (and `gpus_per_worker`) of the cluster,
placed by Ray's scheduler. A worker that dies (its machine lost, the process killed) takes only the
job it was running: that job goes back to the queue and runs on another worker (a fresh one takes
the dead one's place), so every job gives exactly one result. Ray's own task retries stay off, so a
job is never run twice behind the driver's back.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from heisd.errors import HeisdError, UsageError

log = logging.getLogger(__name__)

Setup = Callable[[], Any]  # builds a worker's state, once per worker
Work = Callable[[Any, Any], Any]  # (state, job) -> result
# a job whose worker died this often is not tried again: the job kills workers, not bad luck
MAX_ATTEMPTS = 3


def worker_name() -> str:
    """host:pid of the process running a job (episode lines of Ray runs record it)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LocalExecutor:
    """Jobs in this process (`processes` 1) or a spawned process pool; `here` is the state already
    built in this process, which the in-process executor uses instead of building another."""

    def __init__(self, processes: int = 1):
        self.processes = processes
        self.remote = False

    def map(self, work: Work, jobs: Iterable, setup: Setup | None = None, here: Any = None,
            ordered: bool = False) -> Iterator[tuple[Any, Any]]:
        jobs = list(jobs)
        if self.processes <= 1 or len(jobs) <= 1:
            state = here if here is not None or setup is None else setup()
            for job in jobs:
                yield job, work(state, job)
            return
        from multiprocessing import get_context

        pool = get_context("spawn").Pool(self.processes, initializer=_pool_setup, initargs=(setup,))
        try:
            run = partial(_pool_run, work)
            yield from (pool.imap if ordered else pool.imap_unordered)(run, jobs)
            pool.close()
        finally:
            pool.terminate()  # after close(): the workers are done; on an error or interrupt: stop them


_POOL_STATE: Any = None  # a pool process's worker state


def _pool_setup(setup: Setup | None) -> None:
    global _POOL_STATE
    _POOL_STATE = setup() if setup is not None else None


def _pool_run(work: Work, job: Any) -> tuple[Any, Any]:
    return job, work(_POOL_STATE, job)


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # a cluster's address; None: ray.init()'s (a cluster started here, else a new one)
    workers: int = 0  # actors; 0: as many as the cluster's CPUs (and GPUs) hold
    cpus_per_worker: float = 1.0  # Ray resources each actor reserves (its torch threads)
    gpus_per_worker: float = 0.0


class RayExecutor:
    """Jobs on Ray actors (see the module doc)."""

    def __init__(self, options: RayOptions):
        self.options = options
        self.remote = True

    def map(self, work: Work, jobs: Iterable, setup: Setup | None = None, here: Any = None,
            ordered: bool = False) -> Iterator[tuple[Any, Any]]:
        jobs = list(jobs)
        if not jobs:
            return
        import ray

        started = _connect(self.options.address)
        actor_class = ray.remote(_RayWorker).options(
            num_cpus=self.options.cpus_per_worker, num_gpus=self.options.gpus_per_worker, max_restarts=0,
            max_task_retries=0)
        spawn = partial(actor_class.remote, os.getcwd(), setup, work)
        actors: list[Any] = [spawn() for _ in range(min(self._workers(), len(jobs)))]
        log.info("ray: %d workers for %d jobs", len(actors), len(jobs))
        queue = deque(enumerate(jobs))
        attempts = [0] * len(jobs)
        running: dict[Any, tuple[Any, int]] = {}  # result ref -> (actor, job index)
        idle = list(actors)
        finished: dict[int, Any] = {}  # ordered: results waiting for an earlier job's
        next_out = 0
        window = 2 * len(actors)  # ordered: jobs run at most this far ahead of the next one written
        try:
            while queue or running:
                while idle and queue and (not ordered or queue[0][0] < next_out + window):
                    actor, (index, job) = idle.pop(), queue.popleft()
                    attempts[index] += 1
                    running[actor.run.remote(job)] = (actor, index)
                (ref,), _ = ray.wait(list(running), num_returns=1)
                actor, index = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as err:  # the job raised: the driver raises it as it was
                    raise _cause(err) from None
                except ray.exceptions.RayActorError as err:
                    if attempts[index] >= MAX_ATTEMPTS:
                        raise HeisdError(f"job {jobs[index]!r}: its worker died {MAX_ATTEMPTS} times "
                                         f"(last: {' '.join(str(err).split())[:200]})") from None
                    log.warning("ray: a worker died running %r; it runs again on another worker", jobs[index])
                    actors.remove(actor)
                    replacement = spawn()
                    actors.append(replacement)
                    idle.append(replacement)
                    queue.appendleft((index, jobs[index]))
                    continue
                idle.append(actor)
                if not ordered:
                    yield jobs[index], result
                    continue
                finished[index] = result
                while next_out in finished:
                    yield jobs[next_out], finished.pop(next_out)
                    next_out += 1
        finally:
            for actor in actors:
                ray.kill(actor)
            if started:
                ray.shutdown()

    def _workers(self) -> int:
        import ray

        if self.options.workers:
            return self.options.workers
        resources = ray.cluster_resources()
        fits = [resources.get("CPU", 0) // self.options.cpus_per_worker]
        if self.options.gpus_per_worker:
            fits.append(resources.get("GPU", 0) // self.options.gpus_per_worker)
        return max(1, int(min(fits)))


class _RayWorker:
    """One Ray actor: works in the driver's directory where its machine has it (relative paths in
    the flags then mean the same on every machine), else where `ray start` ran; builds its state
    once; a failed setup is raised by every job it is given (the driver reports it, one line)."""

    def __init__(self, cwd: str, setup: Setup | None, work: Work):
        self.work, self.state, self.error = work, None, None
        if os.path.isdir(cwd):
            os.chdir(cwd)
        try:
            self.state = setup() if setup is not None else None
        except Exception as err:  # noqa: BLE001 - raised with the first job, where the driver sees it
            self.error = err

    def run(self, job: Any) -> Any:
        if self.error is not None:
            raise self.error
        return self.work(self.state, job)


def _connect(address: str | None) -> bool:
    """Join (or start) the cluster unless this process already has; True when it was joined here."""
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as err:
        raise UsageError(f"--ray {address}: {err}") from None
    return True


def _cause(err) -> BaseException:
    """The exception a job raised, without Ray's wrapper (its message is the job's own)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err
