"""The robot side of `heisd serve`.

    from heisd.client import PolicyClient

    client = PolicyClient("http://127.0.0.1:8000")
    step = client.act(image, "open the drawer", proprio=state, episode_id="run-1", reset=True)
    robot.execute(step.actions)                     # [chunk, action_dim]
    step = client.act(image, "open the drawer", proprio=state, ee_pos=moved, episode_id="run-1")
    client.end("run-1", success=True)               # the adaptive skips learn from the outcome

`RemotePolicy` wraps a client in `VLAPolicy`'s interface (reset / act / end_episode), so the
evaluation loop runs unchanged against a server (`heisd eval --server URL`).
A server that is down (restarting) is retried for a while before a request fails; an HTTP error
raises `ServerError` with the server's message.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import json_numpy
import numpy as np
import urllib3
from urllib3.util import Retry

from heisd.errors import HeisdError
from heisd.serving.wire import STEP_HEADER

JSON = {"Content-Type": "application/json"}


class ServerUnreachable(ConnectionError):
    pass


class ServerError(HeisdError, RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


@dataclass(frozen=True)
class Step:
    actions: np.ndarray  # [chunk, action_dim]
    record: dict[str, Any]  # the server's StepRecord: mode, tokens_per_forward, skipped, latency pieces, ...
    timing_ms: dict[str, float]  # Server-Timing: queue, step, total


class PolicyClient:
    def __init__(self, url: str, timeout: float = 60.0, connect_retries: int = 10, backoff_s: float = 0.1):
        """`connect_retries`: attempts to reach a server that refuses connections (e.g. restarting),
        waiting `backoff_s`, 2x, 4x, ... (at most 2 s) between them. Only refused connections are
        retried: a request that may have reached the server is never sent twice.

        urllib3 directly (one kept-alive connection): a `requests` session costs ~1 ms more per call."""
        self.url = url.rstrip("/")
        self._path = urlsplit(self.url).path
        retry = Retry(total=connect_retries, connect=connect_retries, read=0, redirect=0, status=0, other=0,
                      backoff_factor=backoff_s, backoff_max=2.0)
        self.pool = urllib3.connection_from_url(self.url, timeout=timeout, retries=retry)

    def act(self, image: np.ndarray, instruction: str, *, proprio: np.ndarray | None = None,
            ee_pos: np.ndarray | None = None, episode_id: str | None = None, reset: bool = False,
            task: str | None = None, unnorm_key: str | None = None) -> Step:
        fields = {"image": np.ascontiguousarray(image), "instruction": instruction, "proprio": proprio,
                  "ee_pos": None if ee_pos is None else np.asarray(ee_pos), "episode_id": episode_id,
                  "reset": reset, "task": task, "unnorm_key": unnorm_key}
        response = self._send("POST", "/act", json_numpy.dumps({k: v for k, v in fields.items() if v is not None}))
        return Step(json_numpy.loads(response.data), json.loads(response.headers[STEP_HEADER]),
                    _server_timing(response.headers.get("Server-Timing", "")))

    def end(self, episode_id: str, success: bool | None) -> dict:
        """Close an episode; `success` (None: unknown, e.g. aborted) feeds the adaptive skips."""
        return json.loads(self._send("POST", "/end", json.dumps({"episode_id": episode_id, "success": success})).data)

    def info(self) -> dict:
        return json.loads(self._send("GET", "/info").data)

    def healthy(self) -> bool:
        try:
            return self._send("GET", "/healthz").status == 200
        except (ServerUnreachable, ServerError):
            return False

    def close(self) -> None:
        self.pool.close()

    def _send(self, method: str, path: str, body: str | None = None) -> urllib3.BaseHTTPResponse:
        try:
            response = self.pool.request(method, self._path + path, body=body, headers=JSON if body else None)
        except urllib3.exceptions.HTTPError as err:  # refused past the retries, reset, timed out
            raise ServerUnreachable(f"no answer from heisd serve at {self.url} ({err})") from err
        if response.status != 200:
            try:
                message = json.loads(response.data)["error"]
            except (ValueError, KeyError, TypeError):
                message = response.data[:200].decode(errors="replace")
            raise ServerError(response.status, message)
        return response


def _server_timing(header: str) -> dict[str, float]:
    """'queue;dur=0.1, step;dur=5.2' -> {"queue": 0.1, "step": 5.2}."""
    out = {}
    for part in filter(None, (p.strip() for p in header.split(","))):
        name, _, dur = part.partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


class RemotePolicy:
    """`VLAPolicy`'s interface served by a `heisd serve`: one server episode per reset()."""

    def __init__(self, client: PolicyClient):
        self.client = client
        self._prefix = uuid.uuid4().hex[:12]  # episode ids unique to this policy object
        self._episodes = 0
        self._episode: str | None = None
        self._fresh = False  # the next act starts the episode on the server
        self.instruction, self.task = "", None

    def reset(self, instruction: str, task: str | None = None) -> None:
        self._episodes += 1
        self._episode, self._fresh = f"{self._prefix}-{self._episodes}", True
        self.instruction, self.task = instruction, task

    def act(self, image: np.ndarray, state: np.ndarray, ee_path=None):
        from heisd.decoding.cost_rule import CostChoice
        from heisd.runtime.policy import StepRecord

        if self._episode is None:
            raise RuntimeError("call reset(instruction) before act()")
        step = self.client.act(image, self.instruction, proprio=state, ee_pos=ee_path, episode_id=self._episode,
                               reset=self._fresh, task=self.task)
        self._fresh = False
        record = {**step.record, "choices": [CostChoice(**c) for c in step.record.get("choices", [])]}
        return step.actions, StepRecord(**record)

    def end_episode(self, success: bool) -> None:
        if self._episode is not None and not self._fresh:
            self.client.end(self._episode, success)
        self._episode = None

    def skip_thresholds(self) -> list:
        """None here: the adaptive skips live on the server."""
        return []
