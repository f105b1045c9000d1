"""Episodes as sessions: each open `episode_id` owns one `VLAPolicy`, i.e. its own prompt,
kinematic window and proposer state; the model weights and the datastore are shared by all of them.

Policies are pooled. An ended (or expired) episode's policy goes back to the pool and the next
episode `reset()`s it, which by `VLAPolicy`'s contract forgets every per-episode state: this is
how the in-process evaluation runs episode after episode on one policy. So decoders are built
once per concurrently open episode, not once per episode, and a run of sequential episodes
through the server steps exactly like the in-process one (verify-skip thresholds included).

A `SessionStore` is used from the model worker thread only, so it needs no lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


class SessionError(Exception):
    """A request that names an episode the server cannot serve; `status` is the HTTP status."""

    status = 409

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UnknownEpisode(SessionError):
    status = 404


class TooManyEpisodes(SessionError):
    status = 503


@dataclass(frozen=True)
class SessionLimits:
    max_sessions: int = 32  # open episodes at once (each holds its decoders); one more is refused with 503
    idle_timeout_s: float = 300.0  # an episode unused this long is closed (its outcome is never reported)

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or not self.idle_timeout_s > 0:
            raise ValueError(f"need max_sessions >= 1 and idle_timeout_s > 0, got {self}")


@dataclass
class Session:
    policy: object  # VLAPolicy (or anything with its reset / act / end_episode)
    instruction: str
    task: str | None
    last_used: float  # clock reading of the latest request
    steps: int = 0  # act calls since the episode started


class SessionStore:
    def __init__(self, make_policy: Callable[[], object], limits: SessionLimits,
                 clock: Callable[[], float] = time.monotonic):
        self.make_policy, self.limits, self.clock = make_policy, limits, clock
        self.open: dict[str, Session] = {}
        self.idle: list[object] = []  # policies of ended episodes, ready for reset()
        self.expired = 0  # episodes closed for idleness, over the server's life

    def start(self, episode_id: str, instruction: str, task: str | None) -> Session:
        """A new episode, or a restart of an open one (its policy is reset)."""
        self.expire()
        session = self.open.get(episode_id)
        if session is None:
            if len(self.open) >= self.limits.max_sessions:
                raise TooManyEpisodes(f"{len(self.open)} episodes are open (serve --max-sessions); "
                                      "end one (POST /end) or wait for an idle one to expire")
            session = self.open[episode_id] = Session(self._take(), instruction, task, self.clock())
        session.policy.reset(instruction, task)
        session.instruction, session.task, session.steps = instruction, task, 0
        session.last_used = self.clock()
        return session

    def get(self, episode_id: str, instruction: str) -> Session:
        """An open episode, for its next step; the instruction must be the episode's."""
        self.expire()
        session = self.open.get(episode_id)
        if session is None:
            raise UnknownEpisode(f"episode_id {episode_id!r} is not open (never started, ended, expired after "
                                 f"{self.limits.idle_timeout_s:g} s idle, or the server restarted): "
                                 "send reset=true to start it")
        if instruction != session.instruction:
            raise SessionError(f"episode_id {episode_id!r} runs instruction {session.instruction!r}, "
                               f"this request says {instruction!r}: send reset=true to start a new episode")
        session.last_used = self.clock()
        return session

    def end(self, episode_id: str) -> Session:
        session = self.open.pop(episode_id, None)
        if session is None:
            raise UnknownEpisode(f"episode_id {episode_id!r} is not open (never started, already ended, "
                                 "or expired)")
        self.idle.append(session.policy)
        return session

    def borrow(self) -> object:
        """A policy for one step outside any episode; give it back with `give_back`."""
        return self._take()

    def give_back(self, policy: object) -> None:
        self.idle.append(policy)

    def expire(self) -> None:
        cutoff = self.clock() - self.limits.idle_timeout_s
        for episode_id in [e for e, s in self.open.items() if s.last_used < cutoff]:
            self.idle.append(self.open.pop(episode_id).policy)
            self.expired += 1

    def _take(self) -> object:
        return self.idle.pop() if self.idle else self.make_policy()
