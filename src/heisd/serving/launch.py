"""Putting a server together: the target and method -> a service, its /info, a listening socket,
and a uvicorn server (run in the foreground by `heisd serve`, in a thread by the tests)."""

from __future__ import annotations

import platform
import socket
import threading
from dataclasses import asdict

import uvicorn

from heisd.serving.app import create_app
from heisd.serving.config import ServeConfig
from heisd.serving.service import PolicyService, TargetFacts
from heisd.serving.warmup import warm_up


def make_service(target, method, config: ServeConfig, target_path: str,
                 benchmark: str | None = None) -> tuple[PolicyService, dict]:
    """A service for `target` decoded with `method` (a MethodConfig), and its /info document.

    `benchmark` (whose tasks requests may name) must be one the target can act in; None: the
    target's own (`target_benchmark`). Policies come from a `PolicyPool`: the first is built here,
    so a wrong drafter or datastore fails at start-up, not at the first request; later ones share
    its datastore and drafter module read-only, each with its own per-episode state. Only the
    model worker runs them, one step at a time."""
    from heisd.benchmarks.registry import check_target, task_instructions
    from heisd.runtime.policy import PolicyPool

    if benchmark is None:
        benchmark = target_benchmark(target)
    else:
        check_target(benchmark, target.spec)
    tasks = {} if benchmark is None else task_instructions(benchmark)
    keys, codecs = _unnorm_keys(target, benchmark)
    pool = PolicyPool(target, method)
    warmup = warm_up(pool.first, config.warmup_steps, next(iter(tasks.values()), "warm up"))
    decoders = pool.first.decoders
    ee_source = None if decoders.switch is None else (
        "ee_pos or state" if decoders.delta_scale is None else "ee_pos, state or integrated actions")
    facts = TargetFacts(target.spec.state_dim, keys, tasks, codecs, ee_source=ee_source, views=target.spec.views)
    service = PolicyService(pool.make, facts, config)
    return service, {**_info(target, method, pool.first, facts, config, target_path, benchmark), "warmup": warmup}


def target_benchmark(target) -> str | None:
    """The benchmark a server runs under when none is given: mw for a heisd VLA (whose actions must fit
    it); for an OpenVLA target the LIBERO suite its unnorm key names (libero_spatial_no_noops ->
    libero_spatial), else none (a robot of its own: no task registry)."""
    from heisd.benchmarks.libero_protocol import SUITES
    from heisd.benchmarks.mw import ACTION_DIM
    from heisd.errors import UsageError

    if target.spec.protocol == "openvla":
        suite = target.unnorm_keys[0].removesuffix("_no_noops")
        return suite if suite in SUITES else None
    if target.spec.action_dim != ACTION_DIM:
        raise UsageError(f"--target's actions have {target.spec.action_dim} dims, not mw's {ACTION_DIM}: "
                         "give --benchmark, the LIBERO suite it acts in")
    return "mw"


def _unnorm_keys(target, benchmark: str | None) -> tuple[tuple[str, ...], dict]:
    """(the unnorm keys requests may name, the codec of each but the first). OpenVLA: the checkpoint's
    norm_stats keys whose actions have as many dims as the loaded one's (the decoded token count is
    fixed at load); a heisd VLA has one set of statistics, named by its benchmark."""
    if target.spec.protocol != "openvla":
        return (benchmark,), {}
    codecs = {key: target.action_codec(key) for key in target.unnorm_keys}
    keys = tuple(k for k, codec in codecs.items() if codec.action_dim == target.spec.action_dim)
    return keys, {k: codecs[k] for k in keys[1:]}


def _info(target, method, policy, facts: TargetFacts, config: ServeConfig, target_path: str,
          benchmark: str | None) -> dict:
    import fastapi
    import numpy
    import torch

    import heisd

    retrieval = policy.decoders.retrieval
    datastore = None if retrieval is None else {"path": method.datastore, "entries": len(retrieval.datastore)}
    return {
        "target": {"path": target_path, "fingerprint": target.fingerprint(),
                   "action_shape": [target.spec.chunk, target.spec.action_dim], "state_dim": facts.state_dim,
                   "torch_threads": torch.get_num_threads(), "protocol": target.spec.protocol,
                   "views": target.spec.views},
        "benchmark": benchmark,
        "method": method.label,
        "method_config": asdict(method),
        "datastore": datastore,
        "unnorm_keys": list(facts.unnorm_keys),
        # where the kinematic switch's positions come from (ee_pos, else state[:3], else integrated actions)
        "ee_source": facts.ee_source, "delta_scale": policy.decoders.delta_scale,
        "tasks": facts.tasks,
        "limits": asdict(config),
        "versions": {"heisd": heisd.__version__, "python": platform.python_version(), "torch": torch.__version__,
                     "numpy": numpy.__version__, "fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__},
    }


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: any free one). Bound before uvicorn starts, so the port is
    known at once and early clients wait in the backlog instead of being refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it every reply on a kept-alive connection waits ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted server takes its port back
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise SystemExit(f"--host {host} --port {port}: cannot listen there ({err.strerror})") from None
    sock.listen(2048)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(service: PolicyService, info: dict, log_level: str = "warning",
                   protocols: tuple[str, ...] = ("rest",)) -> uvicorn.Server:
    app = create_app(service, {**info, "protocols": list(protocols)}, protocols)
    websockets = "openpi" in protocols
    return uvicorn.Server(uvicorn.Config(
        app, log_level=log_level, access_log=False,
        http="httptools", loop="uvloop",  # C parser and loop: less time per request than h11 and asyncio
        ws="websockets-sansio" if websockets else "none",
        ws_max_size=service.config.max_body_bytes,  # a larger frame is closed with 1009
        ws_per_message_deflate=False,  # openpi's clients ask for no compression; images gain little from it
    ))


class ServerThread:
    """A uvicorn server on its own thread of this process, e.g. inside a test or a notebook."""

    def __init__(self, service: PolicyService, info: dict, host: str = "127.0.0.1", port: int = 0,
                 protocols: tuple[str, ...] = ("rest",)):
        self.service, self.sock = service, listen(host, port)
        self.url = url_of(self.sock)
        self.ws_url = "ws" + self.url.removeprefix("http")
        self.server = uvicorn_server(service, info, protocols=protocols)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
