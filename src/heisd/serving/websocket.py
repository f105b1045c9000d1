"""openpi's websocket protocol on the server's socket (`serve --protocol openpi`).

As openpi's `WebsocketPolicyServer`: on connect the server sends msgpack(metadata) (here the /info
document); then each binary frame from the client is msgpack(observation) and each reply
msgpack({"actions": ..., "server_timing": ...}) (`openpi.py` maps the dicts). Sessions, limits,
queue and model worker are the REST side's.

An error answers as openpi's server does, a text frame with the message (`WebsocketClientPolicy`
raises it as RuntimeError), then closes the connection with code 4000 + the REST side's HTTP status
(4400 undecodable, 4404 episode expired, 4413 too large, 4422 a wrong field, 4500 a server fault,
4503 queue full or too many episodes) and the message as the reason. A frame over
`serve --max-body-mb` is closed by the websocket layer with 1009. Nothing waits forever: every
step has the queue's bound, and a client that goes away mid-step gets its episode closed.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace

from starlette.websockets import WebSocket, WebSocketDisconnect

from heisd.serving.metrics import ServerMetrics
from heisd.serving.msgpack_arrays import packb, unpackb
from heisd.serving.openpi import parse_observation, reply
from heisd.serving.service import PolicyService
from heisd.serving.sessions import SessionError, TooManyEpisodes
from heisd.serving.wire import WireError
from heisd.serving.worker import QueueFull

log = logging.getLogger("heisd.serve")
PATH = "ws"  # the metrics' path label
MAX_REASON_BYTES = 123  # a close frame's reason, by the websocket RFC


async def serve_openpi(ws: WebSocket, service: PolicyService, metadata: dict, metrics: ServerMetrics) -> None:
    await ws.accept()
    episode = Episode(service, f"openpi-{uuid.uuid4().hex[:12]}")
    try:
        await ws.send_bytes(packb(metadata))
        prev_total_ms = None
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            t0 = time.perf_counter()
            try:
                answer = await episode.handle(message, t0, prev_total_ms, metrics)
            except Exception as err:
                await _refuse(ws, err, metrics)
                return
            await ws.send_bytes(answer)
            metrics.request(PATH, 200)
            prev_total_ms = (time.perf_counter() - t0) * 1e3
    except (WebSocketDisconnect, OSError):  # the client left (a send to a closed socket)
        return
    finally:
        episode.close()


class Episode:
    """The episode a connection runs (one at a time; see `openpi.py` for when one starts)."""

    def __init__(self, service: PolicyService, episode_id: str):
        self.service, self.episode_id = service, episode_id
        self.open = False  # a step of an episode was sent to the worker since the last end
        self.instruction: str | None = None  # the open episode's prompt

    async def handle(self, message: dict, t0: float, prev_total_ms: float | None, metrics: ServerMetrics) -> bytes:
        """One client frame (received at `t0`) -> the reply's bytes."""
        data = message.get("bytes")
        if data is None:
            raise WireError(400, "expected a binary frame holding msgpack, got a text frame")
        obs = parse_observation(unpackb(data), self.service.config.wire, self.service.facts.state_dim > 0,
                                self.episode_id)
        if obs.end:
            steps = await self.service.end_episode(self.episode_id, obs.success) if self.open else 0
            self.open, self.instruction = False, None
            return packb({"episode_id": self.episode_id, "steps": steps, "success": obs.success})
        req = obs.request
        if obs.reset or not self.open or req.instruction != self.instruction:
            req = replace(req, reset=True)
        was_open, self.open = self.open, True
        try:
            done = await self.service.act(req)
        except (QueueFull, TooManyEpisodes):
            # refused before a session could start for this id (not queued; no room for one): an end
            # queued for it on close would only take a queue slot another connection's end may need
            self.open = was_open
            raise
        self.instruction = req.instruction
        actions, record = done.value
        total_ms = (time.perf_counter() - t0) * 1e3
        metrics.step(record, done.queue_ms, total_ms)
        return packb(reply(actions, record.as_dict(), done, total_ms, prev_total_ms))

    def close(self) -> None:
        """End the open episode (outcome unknown) so its policy goes back to the pool. Queued behind
        the steps already waiting; if the queue is full the episode expires after
        --session-timeout instead."""
        if not self.open:
            return
        self.open = False
        service, episode_id = self.service, self.episode_id

        def end() -> None:
            try:
                service.end(episode_id, None)
            except SessionError:  # already expired
                pass

        try:
            service.worker.submit(end)
        except QueueFull:
            log.warning("queue full: episode %s is left to expire", episode_id)


async def _refuse(ws: WebSocket, err: Exception, metrics: ServerMetrics) -> None:
    """openpi's error answer (a text frame), then a close whose code carries the HTTP status."""
    if isinstance(err, (WireError, SessionError)):
        status, message = err.status, err.message
    elif isinstance(err, QueueFull):
        status, message = 503, str(err)
    else:  # the server's fault: say so, with the cause, and keep serving other connections
        log.exception("internal error on the websocket")
        status, message = 500, f"internal error: {type(err).__name__}: {err}"
    metrics.request(PATH, status)
    try:
        await ws.send_text(message)
        await ws.close(4000 + status, _reason(message))
    except (WebSocketDisconnect, OSError, RuntimeError):  # the client has gone already
        pass


def _reason(message: str) -> str:
    raw = message.encode()
    if len(raw) <= MAX_REASON_BYTES:
        return message
    return raw[: MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."
