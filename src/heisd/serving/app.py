"""The HTTP face of a `PolicyService` (FastAPI on uvicorn).

    POST /act      deploy.py-compatible: json-numpy `image` + `instruction` (+ `unnorm_key`), or
                   {"encoded": ...}; HeiSD fields `episode_id`, `reset`, `proprio`, `ee_pos`, `task`,
                   `wrist_image` (the wrist camera, for a target that reads it: /info's target "views" 2).
                   Reply: the action array [chunk, action_dim] as json-numpy (encoded like the request);
                   header `X-HeiSD-Step`: the step record as JSON; `Server-Timing`: queue / step / total ms.
                   The same fields as msgpack (Content-Type: application/msgpack) get a msgpack reply
                   {"actions", "heisd_step"} (and `Server-Timing`).
    POST /end      {"episode_id", "success"}: close the episode, feed its outcome to the adaptive skips
    GET  /healthz  200 while the model worker is up
    GET  /info     target, method, datastore, fingerprint, limits, versions
    GET  /metrics  Prometheus text format

    WS   /         openpi's websocket protocol (`serve --protocol openpi`; see websocket.py)

Every error is a 4xx (bad input) or 5xx (the server's fault, or a full queue) with {"error": message};
an error never comes back as 200. /act and /end are served with the "rest" protocol, the websocket
with "openpi"; /healthz, /info and /metrics always.
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from typing import Awaitable, Callable

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from heisd.serving.metrics import ServerMetrics
from heisd.serving.service import PolicyService
from heisd.serving.sessions import SessionError
from heisd.serving.websocket import serve_openpi
from heisd.serving.wire import (MSGPACK, STEP_HEADER, WireError, encode_actions, encode_binary_reply, encode_record,
                                parse_act, parse_end)
from heisd.serving.worker import QueueFull

log = logging.getLogger("heisd.serve")
PROTOCOLS = ("rest", "openpi")


def create_app(service: PolicyService, info: dict, protocols: tuple[str, ...] = ("rest",)) -> FastAPI:
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown or not protocols:
        raise ValueError(f"protocols must be some of {PROTOCOLS}, got {protocols}")
    metrics = ServerMetrics(lambda: service.worker.depth, lambda: len(service.sessions.open))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        service.close()

    app = FastAPI(title="heisd policy server", lifespan=lifespan, docs_url=None, redoc_url=None)

    async def answer(path: str, handler: Callable[[], Awaitable[Response]]) -> Response:
        try:
            response = await handler()
        except (WireError, SessionError) as err:
            response = _error(err.status, err.message)
        except QueueFull as err:
            response = _error(503, str(err))
        except Exception as err:  # the server's fault: say so, with the cause, and keep serving
            log.exception("internal error on %s", path)
            response = _error(500, f"internal error: {type(err).__name__}: {err}")
        metrics.request(path, response.status_code)
        return response

    async def act(request: Request) -> Response:
        async def handle() -> Response:
            t0 = time.perf_counter()
            req = parse_act(await _body(request, service.config.max_body_bytes), service.config.wire,
                            request.headers.get("content-type"))
            done = await service.act(req)
            actions, record = done.value
            if req.binary:  # the record rides in the msgpack body
                body, media, headers = encode_binary_reply(actions, record.as_dict()), MSGPACK, {}
            else:
                body, media = encode_actions(actions, req.encoded), "application/json"
                headers = {STEP_HEADER: encode_record(record.as_dict())}
            total_ms = (time.perf_counter() - t0) * 1e3
            metrics.step(record, done.queue_ms, total_ms)
            headers["Server-Timing"] = (f"queue;dur={done.queue_ms:.3f}, step;dur={done.run_ms:.3f}, "
                                        f"total;dur={total_ms:.3f}")
            return Response(body, media_type=media, headers=headers)
        return await answer("/act", handle)

    async def end(request: Request) -> Response:
        async def handle() -> Response:
            episode_id, success = parse_end(await _body(request, service.config.max_body_bytes))
            steps = await service.end_episode(episode_id, success)
            return JSONResponse({"episode_id": episode_id, "steps": steps, "success": success})
        return await answer("/end", handle)

    async def openpi(ws: WebSocket) -> None:
        await serve_openpi(ws, service, {**info, "protocol": "openpi"}, metrics)

    if "rest" in protocols:  # plain Starlette routes: FastAPI's parameter machinery costs ~0.1 ms a step
        app.router.add_route("/act", act, methods=["POST"])
        app.router.add_route("/end", end, methods=["POST"])
    if "openpi" in protocols:
        app.add_api_websocket_route("/", openpi)

    @app.get("/healthz")
    async def healthz() -> Response:
        async def handle() -> Response:
            if not service.worker.alive:
                return _error(503, "the model worker has stopped")
            return JSONResponse({"status": "ok"})
        return await answer("/healthz", handle)

    @app.get("/info")
    async def get_info() -> Response:
        async def handle() -> Response:
            return JSONResponse(info)
        return await answer("/info", handle)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        async def handle() -> Response:
            return Response(metrics.render(), media_type=metrics.content_type)
        return await answer("/metrics", handle)

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise WireError(400, f"Content-Length: not a number ({declared!r})")
        if int(declared) > limit:
            raise WireError(413, f"request body of {int(declared)} bytes exceeds {limit} (serve --max-body-mb)")
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no declared length: count it
        size += len(chunk)
        if size > limit:
            raise WireError(413, f"request body exceeds {limit} bytes (serve --max-body-mb)")
        chunks.append(chunk)
    return b"".join(chunks)
