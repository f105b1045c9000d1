"""`heisd serve`: the policy behind HTTP (OpenVLA deploy.py-style clients) and openpi's websocket
protocol (openpi-client's WebsocketClientPolicy), for robots."""

from __future__ import annotations

import argparse

HELP = ("Serve a policy: OpenVLA-compatible POST /act with HeiSD episodes (REST) and/or openpi's websocket "
        "protocol; /healthz, /info, /metrics.")
PROTOCOLS = {"rest": ("rest",), "openpi": ("openpi",), "both": ("rest", "openpi")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.commands.common import add_method_arguments
    from heisd.serving.config import ServeConfig
    from heisd.serving.sessions import SessionLimits
    from heisd.serving.wire import WireLimits

    add_method_arguments(p, benchmark=None, benchmark_help=(
        " whose tasks requests may name; None: the target's own (mw for a heisd VLA; for OpenVLA the LIBERO "
        "suite its --unnorm-key names, else no benchmark)"))
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port; the URL is printed)")
    p.add_argument("--protocol", default="rest", choices=list(PROTOCOLS),
                   help="rest: POST /act and /end (JSON, OpenVLA deploy.py's format plus HeiSD's fields); "
                        "openpi: openpi's websocket protocol on ws://HOST:PORT (msgpack-numpy, metadata on connect; "
                        "openpi-client's WebsocketClientPolicy works unchanged); both: the two on one port, "
                        "sharing episodes' limits, queue and model worker")
    p.add_argument("--queue-size", type=int, default=ServeConfig.queue_size,
                   help="requests waiting for the model worker; one more is answered 503")
    p.add_argument("--max-sessions", type=int, default=SessionLimits.max_sessions,
                   help="episodes open at once (each holds its own decoder state); one more is answered 503")
    p.add_argument("--session-timeout", type=float, default=SessionLimits.idle_timeout_s,
                   help="seconds after which an idle episode is closed")
    p.add_argument("--max-body-mb", type=float, default=ServeConfig.max_body_bytes / 2**20,
                   help="request body limit in MiB (413 above)")
    p.add_argument("--max-image-side", type=int, default=WireLimits.max_image_side,
                   help="largest image side in pixels (413 above)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="control steps run on a synthetic observation before listening, so that a robot's first "
                        "steps do not pay for capturing CUDA graphs (each new pass shape costs a few passes once); "
                        "default: 4 with --cuda-graphs, else 0. /info says what they took")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="uvicorn log level (info logs every request)")


def serve_config(args: argparse.Namespace):
    from heisd.serving.config import ServeConfig
    from heisd.serving.sessions import SessionLimits
    from heisd.serving.wire import WireLimits

    if args.queue_size < 1 or args.max_body_mb <= 0 or args.max_image_side < 1:
        raise SystemExit("--queue-size, --max-body-mb and --max-image-side must be positive")
    warmup = args.warmup_steps if args.warmup_steps is not None else (4 if args.cuda_graphs else 0)
    try:
        sessions = SessionLimits(args.max_sessions, args.session_timeout)
    except ValueError:
        raise SystemExit("--max-sessions and --session-timeout must be positive") from None
    try:
        return ServeConfig(queue_size=args.queue_size, max_body_bytes=int(args.max_body_mb * 2**20),
                           wire=WireLimits(max_image_side=args.max_image_side), sessions=sessions, warmup_steps=warmup)
    except ValueError:
        raise SystemExit(f"--warmup-steps must be >= 0, got {warmup}") from None


def run(args: argparse.Namespace) -> int:
    from heisd.commands.common import load_target, method_config
    from heisd.serving.launch import listen, make_service, url_of, uvicorn_server

    config = serve_config(args)
    method = method_config(args)
    service, info = make_service(load_target(args), method, config, args.target, args.benchmark)
    sock = listen(args.host, args.port)
    # one line a supervisor (or `heisd loadtest`) can read the URL from
    protocols = PROTOCOLS[args.protocol]
    url = url_of(sock)
    urls = ([url] if "rest" in protocols else []) + (["ws" + url.removeprefix("http")] if "openpi" in protocols else [])
    print(f"heisd serve: {method.label} on {' and '.join(urls)}", flush=True)
    try:
        uvicorn_server(service, info, args.log_level, protocols).run(sockets=[sock])
    finally:
        sock.close()
    return 0
