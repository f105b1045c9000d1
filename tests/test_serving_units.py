"""The server's parts without HTTP: episode sessions (pooling, expiry), the model worker's queue."""

from __future__ import annotations

import threading
import time

import pytest

from heisd.serving.sessions import SessionLimits, SessionStore, TooManyEpisodes, UnknownEpisode
from heisd.serving.worker import ModelWorker, QueueFull


class Recorder:
    """A stand-in policy that records what the store does to it (the store only resets it)."""

    def __init__(self):
        self.resets: list[tuple[str, str | None]] = []

    def reset(self, instruction: str, task: str | None = None) -> None:
        self.resets.append((instruction, task))


def test_sessions_pool_policies_and_expire_idle_episodes():
    now = [0.0]
    built: list[Recorder] = []

    def make() -> Recorder:
        built.append(Recorder())
        return built[-1]

    store = SessionStore(make, SessionLimits(max_sessions=2, idle_timeout_s=10.0), clock=lambda: now[0])
    a = store.start("a", "open the drawer", "drawer-open-v3")
    store.start("b", "close the drawer", None)
    with pytest.raises(TooManyEpisodes):
        store.start("c", "open the door", None)
    assert len(built) == 2 and a.policy.resets == [("open the drawer", "drawer-open-v3")]
    store.end("a")
    c = store.start("c", "open the door", None)  # a's policy, reset: no third build
    assert len(built) == 2 and c.policy is a.policy and c.policy.resets[-1] == ("open the door", None)
    now[0] = 5.0
    store.get("c", "open the door")  # c used at t=5, b last at t=0
    now[0] = 12.0
    with pytest.raises(UnknownEpisode, match="expired after 10 s"):
        store.get("b", "close the drawer")
    assert store.expired == 1 and store.get("c", "open the door").policy is a.policy
    store.start("d", "open the door", None)  # b's expired policy is reused
    assert len(built) == 2


def test_worker_runs_in_order_and_refuses_when_full():
    worker = ModelWorker(max_queue=2)
    started, release, order = threading.Event(), threading.Event(), []
    blocker = worker.submit(lambda: (started.set(), release.wait(10)))
    assert started.wait(10)
    queued = [worker.submit(lambda i=i: order.append(i) or i) for i in range(2)]
    assert worker.depth == 2
    with pytest.raises(QueueFull, match="--queue-size"):
        worker.submit(lambda: None)
    time.sleep(0.05)
    release.set()
    assert [f.result(10).value for f in queued] == [0, 1] and order == [0, 1]
    assert blocker.result(10).run_ms >= 50 and all(f.result().queue_ms >= 50 for f in queued)  # waited for it
    failing = worker.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert worker.submit(lambda: "still up").result(10).value == "still up"
    worker.close()
    assert not worker.alive
