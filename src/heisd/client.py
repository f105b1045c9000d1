"""The robot side of `heisd serve`.

    from heisd.client import PolicyClient

    client = PolicyClient("http://127.0.0.1:8000")
    step = client.act(image, "open the drawer", proprio=state, episode_id="run-1", reset=True)
    robot.execute(step.actions)                     # [chunk, action_dim]
    step = client.act(image, "open the drawer", proprio=state, ee_pos=moved, episode_id="run-1")
    client.end("run-1", success=True)               # the adaptive skips learn from the outcome

`OpenpiClient` makes the same calls over openpi's websocket protocol (`serve --protocol openpi`);
`connect(url)` picks one by the URL's scheme. `RemotePolicy` wraps either in `VLAPolicy`'s interface
(reset / act / end_episode), so the evaluation loop runs unchanged against a server
(`heisd eval --server URL`).
A server that is down (restarting) is retried for a while before a request fails; an HTTP error
raises `ServerError` with the server's message.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import json_numpy
import numpy as np

from heisd.data.views import split_frame
from heisd.errors import HeisdError
from heisd.serving.msgpack_arrays import packb, unpackb
from heisd.serving.wire import MSGPACK, STEP_HEADER

JSON = {"Content-Type": "application/json"}
MSGPACK_HEADERS = {"Content-Type": MSGPACK}


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


@dataclass(frozen=True)
class _Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    data: bytes


class PolicyClient:
    def __init__(self, url: str, timeout: float = 60.0, connect_retries: int = 10, backoff_s: float = 0.1,
                 encoding: str = "msgpack"):
        """`connect_retries`: attempts to reach a server that refuses connections (e.g. restarting),
        waiting `backoff_s`, 2x, 4x, ... (at most 2 s) between them. Only refused connections are
        retried: a request that may have reached the server is never sent twice.

        One kept-alive `http.client` connection, each request written in one send: urllib3 writes
        headers and body apart, and the server's extra wake-up for the second write cost about half a
        millisecond per step on the loaded 2-core machine (a `requests` session costs more still).
        `encoding`: "msgpack" (binary arrays: no base64 JSON text to build and parse, most of a
        millisecond per 128x128 frame there) or "json" (deploy.py's json-numpy, as third-party
        clients send it). BENCHMARKS 5.1 measures the whole."""
        if encoding not in ("msgpack", "json"):
            raise ValueError(f"encoding must be 'msgpack' or 'json', got {encoding!r}")
        self.encoding, self.timeout = encoding, timeout
        self.connect_retries, self.backoff_s = connect_retries, backoff_s
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url}: expected an http:// or https:// URL")
        self._path = parts.path
        self._https, self._host = parts.scheme == "https", parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._conn: http.client.HTTPConnection | None = None

    def act(self, image: np.ndarray, instruction: str, *, proprio: np.ndarray | None = None,
            ee_pos: np.ndarray | None = None, episode_id: str | None = None, reset: bool = False,
            task: str | None = None, unnorm_key: str | None = None, wrist_image: np.ndarray | None = None) -> Step:
        fields = {"image": np.ascontiguousarray(image), "instruction": instruction, "proprio": proprio,
                  "ee_pos": None if ee_pos is None else np.asarray(ee_pos), "episode_id": episode_id,
                  "reset": reset, "task": task, "unnorm_key": unnorm_key,
                  "wrist_image": None if wrist_image is None else np.ascontiguousarray(wrist_image)}
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.encoding == "msgpack":
            response = self._send("POST", "/act", packb(fields), MSGPACK_HEADERS)
            reply = unpackb(response.data)
            actions, record = reply["actions"].copy(), reply["heisd_step"]  # writable, not a view of the reply
        else:
            response = self._send("POST", "/act", json_numpy.dumps(fields).encode())
            actions, record = json_numpy.loads(response.data), json.loads(response.headers[STEP_HEADER.lower()])
        return Step(actions, record, _server_timing(response.headers.get("server-timing", "")))

    def end(self, episode_id: str, success: bool | None) -> dict:
        """Close an episode; `success` (None: unknown, e.g. aborted) feeds the adaptive skips."""
        body = json.dumps({"episode_id": episode_id, "success": success}).encode()
        return json.loads(self._send("POST", "/end", body).data)

    def info(self) -> dict:
        return json.loads(self._send("GET", "/info").data)

    def healthy(self) -> bool:
        try:
            return self._send("GET", "/healthz").status == 200
        except (ServerUnreachable, ServerError):
            return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        """The kept-alive connection; a new one if there is none or the server closed it (idle
        keep-alive timeout, restart): a readable idle socket means EOF, nothing was sent on it."""
        conn = self._conn
        if conn is not None and conn.sock is not None and not _readable(conn.sock):
            return conn
        self.close()
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        for attempt in range(self.connect_retries + 1):
            conn = kind(self._host, self._port, timeout=self.timeout)
            try:
                conn.connect()
                break
            except ConnectionRefusedError as err:  # down (restarting): wait, then retry
                conn.close()
                if attempt == self.connect_retries:
                    raise ServerUnreachable(f"no answer from heisd serve at {self.url} ({err})") from err
                time.sleep(min(self.backoff_s * 2**attempt, 2.0))
            except OSError as err:
                conn.close()
                raise ServerUnreachable(f"no answer from heisd serve at {self.url} ({err})") from err
        # replies must not wait for a delayed ACK (Nagle) on a kept-alive connection
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = conn
        return conn

    def _send(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> _Reply:
        conn = self._connection()
        try:
            # bytes body: http.client writes request line, headers and body in one send
            conn.request(method, self._path + path, body=body, headers=headers or (JSON if body else {}))
            response = conn.getresponse()
            reply = _Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        except (OSError, http.client.HTTPException) as err:  # reset, timed out, closed mid-request
            self.close()
            raise ServerUnreachable(f"no answer from heisd serve at {self.url} ({type(err).__name__}: {err})") from err
        if response.will_close:
            self.close()
        if reply.status != 200:
            try:
                message = json.loads(reply.data)["error"]
            except (ValueError, KeyError, TypeError):
                message = reply.data[:200].decode(errors="replace")
            raise ServerError(reply.status, message)
        return reply


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read (EOF: the server closed it)."""
    if hasattr(select, "poll"):  # poll: no limit on descriptor numbers, unlike select
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


def _server_timing(header: str) -> dict[str, float]:
    """'queue;dur=0.1, step;dur=5.2' -> {"queue": 0.1, "step": 5.2}."""
    out = {}
    for part in filter(None, (p.strip() for p in header.split(","))):
        name, _, dur = part.partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


class OpenpiClient:
    """`PolicyClient`'s calls over openpi's websocket protocol (`heisd serve --protocol openpi`):
    msgpack-numpy frames on one kept-open connection. The connection is the episode: `episode_id`
    is accepted for `PolicyClient`'s signature and not sent; `reset=True` starts a new episode.
    An error closes the connection (`ServerError` with the server's status and message); the next
    act() with reset=True reconnects."""

    def __init__(self, url: str, timeout: float = 60.0, connect_retries: int = 10, backoff_s: float = 0.1):
        self.url, self.timeout = url.rstrip("/"), timeout
        self.connect_retries, self.backoff_s = connect_retries, backoff_s
        self._ws = None
        self._metadata: dict | None = None

    def act(self, image: np.ndarray, instruction: str, *, proprio: np.ndarray | None = None,
            ee_pos: np.ndarray | None = None, episode_id: str | None = None, reset: bool = False,
            task: str | None = None, unnorm_key: str | None = None, wrist_image: np.ndarray | None = None) -> Step:
        if self._ws is None and not reset:
            raise ServerError(404, f"the connection to {self.url} closed, and its episode with it: "
                                   "send reset=True to start a new one")
        fields = {"image": np.ascontiguousarray(image), "prompt": instruction, "proprio": proprio,
                  "ee_pos": None if ee_pos is None else np.asarray(ee_pos), "reset": reset, "task": task,
                  "unnorm_key": unnorm_key,
                  "wrist_image": None if wrist_image is None else np.ascontiguousarray(wrist_image)}
        reply = self._exchange(packb({k: v for k, v in fields.items() if v is not None}))
        timing = reply["server_timing"]
        return Step(reply["actions"].copy(), reply["heisd_step"],
                    {"queue": timing["queue_ms"], "step": timing["infer_ms"], "total": timing["total_ms"]})

    def end(self, episode_id: str | None = None, success: bool | None = None) -> dict:
        """Close the connection's episode; `success` (None: unknown) feeds the adaptive skips."""
        if self._ws is None:
            raise ServerError(404, f"the connection to {self.url} closed, and its episode with it")
        return self._exchange(packb({"end": True, "success": success}))

    def info(self) -> dict:
        """The metadata the server sent on connect (its /info document)."""
        self._connection()
        return self._metadata

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def _connection(self):
        from websockets.sync.client import connect

        if self._ws is None:
            for attempt in range(self.connect_retries + 1):
                try:
                    # legacy=True: a connection held across calls, not a `with` block
                    ws = connect(self.url, compression=None, max_size=None, open_timeout=self.timeout, legacy=True)
                    break
                except (ConnectionRefusedError, TimeoutError) as err:  # down (restarting): wait, then retry
                    if attempt == self.connect_retries:
                        raise ServerUnreachable(f"no answer from heisd serve at {self.url} ({err})") from err
                    time.sleep(min(self.backoff_s * 2**attempt, 2.0))
            self._metadata = unpackb(ws.recv(self.timeout))
            self._ws = ws
        return self._ws

    def _exchange(self, frame: bytes) -> dict:
        from websockets.exceptions import ConnectionClosed

        ws = self._connection()
        try:
            ws.send(frame)
            answer = ws.recv(self.timeout)
        except ConnectionClosed as err:
            self._ws = None
            raise _closed_error(err) from None
        except TimeoutError as err:
            self.close()
            raise ServerUnreachable(f"no answer from {self.url} within {self.timeout:g} s") from err
        if isinstance(answer, str):  # the server's error message; the close frame carries the status
            self._ws = None
            try:
                ws.recv(self.timeout)
            except ConnectionClosed as err:
                code = err.rcvd.code if err.rcvd is not None else 1006
                raise ServerError(code - 4000 if 4000 <= code < 5000 else 500, answer) from None
            except TimeoutError:
                ws.close()
            raise ServerError(500, answer)
        return unpackb(answer)


def _closed_error(err) -> ServerError:
    """The server closed the connection without an error frame (e.g. 1009: a frame over its limit)."""
    close = err.rcvd
    if close is None:
        return ServerError(502, f"the connection closed without a close frame ({err})")
    status = close.code - 4000 if 4000 <= close.code < 5000 else (413 if close.code == 1009 else 502)
    return ServerError(status, f"connection closed ({close.code}): {close.reason or 'no reason given'}")


def connect(url: str, **kwargs) -> PolicyClient | OpenpiClient:
    """A client for `url`: http(s):// -> REST (`PolicyClient`), ws(s):// -> openpi's websocket (`OpenpiClient`)."""
    scheme = urlsplit(url).scheme
    if scheme in ("http", "https"):
        return PolicyClient(url, **kwargs)
    if scheme in ("ws", "wss"):
        return OpenpiClient(url, **kwargs)
    raise ValueError(f"{url}: expected an http://, https://, ws:// or wss:// URL")


class RemotePolicy:
    """`VLAPolicy`'s interface served by a `heisd serve`: one server episode per reset(). `views` 2 (the
    server's target reads the wrist camera too): `act` takes the two cameras stacked (`heisd.data.views`)
    and sends them apart, as `image` and `wrist_image`."""

    def __init__(self, client: PolicyClient | OpenpiClient, views: int = 1):
        self.client, self.views = client, views
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
        image, wrist = (image, None) if self.views == 1 else split_frame(image)
        step = self.client.act(image, self.instruction, proprio=state, ee_pos=ee_path, episode_id=self._episode,
                               reset=self._fresh, task=self.task, wrist_image=wrist)
        self._fresh = False
        record = {**step.record, "choices": [CostChoice(**c) for c in step.record.get("choices", [])]}
        return step.actions, StepRecord(**record)

    def end_episode(self, success: bool | None) -> None:
        """Close the server episode; `success` None closes it without teaching the adaptive skips."""
        if self._episode is not None and not self._fresh:
            self.client.end(self._episode, success)
        self._episode = None

    def skip_thresholds(self) -> list:
        """None here: the adaptive skips live on the server."""
        return []
