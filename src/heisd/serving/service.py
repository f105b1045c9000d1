"""What the server does, without HTTP: check a request against the target, run it on the model
worker inside its episode, end episodes. `app.py` maps this onto routes and status codes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from heisd.serving.config import ServeConfig
from heisd.serving.sessions import SessionStore
from heisd.targets.base import ActionCodec, resolve_unnorm_key
from heisd.serving.wire import ActRequest, WireError
from heisd.serving.worker import Done, ModelWorker


@dataclass(frozen=True)
class TargetFacts:
    """What requests are checked against."""

    state_dim: int  # length of `proprio` (0: the target takes no state)
    # the action statistics a request may name in `unnorm_key` (OpenVLA: config.json's norm_stats keys; a
    # heisd VLA: the name of its benchmark); the first is the target's own, used when a request names none
    unnorm_keys: tuple[str, ...]
    tasks: dict[str, str]  # task name -> instruction (a request's instruction finds its task here)
    # unnorm key -> how tokens become actions with its statistics, for every key but the first
    codecs: dict[str, ActionCodec] = field(default_factory=dict)
    # what the kinematic switch reads: None (no switch), "ee_pos or state" (a request must send one),
    # "ee_pos, state or integrated actions" (without either, the emitted actions are integrated)
    ee_source: str | None = None
    views: int = 1  # cameras the target reads: 2 = a request's image and wrist_image (`ActRequest.frame`)

    def __post_init__(self) -> None:
        if not self.unnorm_keys or set(self.codecs) != set(self.unnorm_keys[1:]):  # no key may fall back silently
            raise ValueError(f"codecs {sorted(self.codecs)} must be those of unnorm keys {self.unnorm_keys[1:]}")


class PolicyService:
    def __init__(self, make_policy: Callable[[], Any], facts: TargetFacts, config: ServeConfig):
        self.facts, self.config = facts, config
        self.sessions = SessionStore(make_policy, config.sessions)
        self.worker = ModelWorker(config.queue_size)
        self._task_of = {instruction: task for task, instruction in facts.tasks.items()}

    def check(self, req: ActRequest) -> tuple[str | None, str]:
        """Refuse what the target cannot take (before it queues); return the request's task and unnorm key."""
        if self.facts.state_dim:
            if req.proprio is None:
                raise WireError(422, f"proprio: missing (this target takes a {self.facts.state_dim}-value state)")
            if req.proprio.shape != (self.facts.state_dim,):
                raise WireError(422, f"proprio: shape {list(req.proprio.shape)}, expected [{self.facts.state_dim}]")
        elif req.proprio is not None:
            raise WireError(422, "proprio: this target takes no state")
        if self.facts.ee_source == "ee_pos or state" and req.ee_pos is None and (
                req.proprio is None or req.proprio.size < 3):
            raise WireError(422, "ee_pos: missing; the kinematic switch needs the end-effector position (ee_pos, or a "
                                 "state whose first three values are it), and this datastore cannot integrate actions")
        key = self.facts.unnorm_keys[0]
        if req.unnorm_key is not None:
            key = resolve_unnorm_key(req.unnorm_key, self.facts.unnorm_keys)
            if key is None:
                raise WireError(422, f"unnorm_key: unknown {req.unnorm_key!r}; this target has "
                                     f"{', '.join(self.facts.unnorm_keys)}")
        if req.task is not None:
            if req.task not in self.facts.tasks:
                known = ", ".join(self.facts.tasks) or "none (the server runs under no benchmark: serve --benchmark)"
                raise WireError(422, f"task: unknown {req.task!r}; known: {known}")
            return req.task, key
        return self._task_of.get(req.instruction), key

    async def act(self, req: ActRequest) -> Done:
        """Check `req`, then run its step on the model worker (awaited from the event loop; every
        protocol's requests go through here). -> Done whose value is (actions, StepRecord)."""
        task, unnorm_key = self.check(req)
        return await asyncio.wrap_future(self.worker.submit(lambda: self.step(req, task, unnorm_key)))

    async def end_episode(self, episode_id: str, success: bool | None) -> int:
        done = await asyncio.wrap_future(self.worker.submit(lambda: self.end(episode_id, success)))
        return done.value

    def step(self, req: ActRequest, task: str | None, unnorm_key: str | None = None) -> tuple[np.ndarray, Any]:
        """One control step; runs on the model worker. -> (actions [chunk, action_dim], StepRecord).
        Another `unnorm_key` than the target's own de-normalizes the same tokens with its statistics."""
        actions, record = self._act(req, task)
        codec = self.facts.codecs.get(unnorm_key)  # None for the target's own key
        if codec is not None:
            actions = codec.decode(np.asarray(record.tokens).reshape(actions.shape))
        return actions, record

    def _act(self, req: ActRequest, task: str | None) -> tuple[np.ndarray, Any]:
        state = req.proprio if req.proprio is not None else np.zeros(0, np.float32)
        if req.episode_id is None:  # a one-off step: a pooled policy, reset for it
            policy = self.sessions.borrow()
            try:
                policy.reset(req.instruction, task)
                return policy.act(req.frame(self.facts.views), state, req.ee_pos)
            finally:
                self.sessions.give_back(policy)
        if req.reset:
            session = self.sessions.start(req.episode_id, req.instruction, task)
        else:
            session = self.sessions.get(req.episode_id, req.instruction)
        out = session.policy.act(req.frame(self.facts.views), state, req.ee_pos)
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
