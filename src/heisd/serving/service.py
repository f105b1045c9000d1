"""What the server does, without HTTP: check a request against the target, run it on the model
worker inside its episode, end episodes. `app.py` maps this onto routes and status codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from heisd.serving.sessions import SessionLimits, SessionStore
from heisd.serving.wire import ActRequest, WireError, WireLimits
from heisd.serving.worker import ModelWorker


@dataclass(frozen=True)
class ServeConfig:
    queue_size: int = 32  # requests waiting for the model worker; one more is refused with 503
    max_body_bytes: int = 8 << 20  # request body limit (413 above): a 1024x1024 image fits with room
    wire: WireLimits = field(default_factory=WireLimits)
    sessions: SessionLimits = field(default_factory=SessionLimits)


@dataclass(frozen=True)
class TargetFacts:
    """What requests are checked against."""

    state_dim: int  # length of `proprio` (0: the target takes no state)
    unnorm_keys: tuple[str, ...]  # action statistics the target un-normalizes with; the first is the default
    tasks: dict[str, str]  # task name -> instruction (a request's instruction finds its task here)


class PolicyService:
    def __init__(self, make_policy: Callable[[], Any], facts: TargetFacts, config: ServeConfig):
        self.facts, self.config = facts, config
        self.sessions = SessionStore(make_policy, config.sessions)
        self.worker = ModelWorker(config.queue_size)
        self._task_of = {instruction: task for task, instruction in facts.tasks.items()}

    def check(self, req: ActRequest) -> str | None:
        """Refuse what the target cannot take (before it queues); return the request's task."""
        if self.facts.state_dim:
            if req.proprio is None:
                raise WireError(422, f"proprio: missing (this target takes a {self.facts.state_dim}-value state)")
            if req.proprio.shape != (self.facts.state_dim,):
                raise WireError(422, f"proprio: shape {list(req.proprio.shape)}, expected [{self.facts.state_dim}]")
        elif req.proprio is not None:
            raise WireError(422, "proprio: this target takes no state")
        if req.unnorm_key is not None and req.unnorm_key not in self.facts.unnorm_keys:
            raise WireError(422, f"unnorm_key: unknown {req.unnorm_key!r}; this target has "
                                 f"{', '.join(self.facts.unnorm_keys)}")
        if req.task is not None:
            if req.task not in self.facts.tasks:
                raise WireError(422, f"task: unknown {req.task!r}; known: {', '.join(self.facts.tasks)}")
            return req.task
        return self._task_of.get(req.instruction)

    def step(self, req: ActRequest, task: str | None) -> tuple[np.ndarray, Any]:
        """One control step; runs on the model worker. -> (actions [chunk, action_dim], StepRecord)."""
        state = req.proprio if req.proprio is not None else np.zeros(0, np.float32)
        if req.episode_id is None:  # a one-off step: a pooled policy, reset for it
            policy = self.sessions.borrow()
            try:
                policy.reset(req.instruction, task)
                return policy.act(req.image, state, req.ee_pos)
            finally:
                self.sessions.give_back(policy)
        if req.reset:
            session = self.sessions.start(req.episode_id, req.instruction, task)
        else:
            session = self.sessions.get(req.episode_id, req.instruction)
        out = session.policy.act(req.image, state, req.ee_pos)
        session.steps += 1
        return out

    def end(self, episode_id: str, success: bool | None) -> int:
        """Close an episode; a known outcome teaches the policy (the adaptive skips). Runs on the
        model worker. -> steps the episode took."""
        session = self.sessions.end(episode_id)
        if success is not None:
            session.policy.end_episode(success)
        return session.steps

    def close(self) -> None:
        self.worker.close()
