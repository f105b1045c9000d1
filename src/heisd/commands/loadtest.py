"""`heisd loadtest`: N concurrent clients x M requests against a `heisd serve` on this machine."""

from __future__ import annotations

import argparse
import json

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = ("Load-test a running `heisd serve` on loopback over REST and/or openpi's websocket: throughput, "
        "p50/p90/p99 latency, queueing, errors, session mix-ups, and the server's overhead over in-process decoding.")

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from heisd.profiling.loadtest import LoadConfig

    p.add_argument("--server", required=True, metavar="URL",
                   help="the server, on this machine (e.g. http://127.0.0.1:8000); its target and method "
                        "are read from /info and loaded here for the in-process reference")
    p.add_argument("--demos", nargs="+", required=True, help="demonstration HDF5 files whose episodes clients replay")
    p.add_argument("--protocol", default="served", choices=["served", "rest", "openpi"],
                   help="which protocol's clients to measure: rest (POST /act), openpi (the websocket at ws://HOST:PORT), "
                        "or every one the server serves (its /info 'protocols'); with both, the one-client pass "
                        "alternates them step by step")
    p.add_argument("--clients", type=int, default=LoadConfig.clients, help="concurrent clients")
    p.add_argument("--requests", type=int, default=LoadConfig.requests, help="requests per client")
    p.add_argument("--time-limit", type=float, default=LoadConfig.time_limit_s,
                   help="seconds per pass after which no request is sent")
    p.add_argument("--out", default=None, help="write the report as JSON here too")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report at --out")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path
    from urllib.parse import urlsplit

    import torch

    from heisd.client import PolicyClient, ServerUnreachable
    from heisd.data.dataset import DemoFile
    from heisd.runtime.methods import MethodConfig, build_decoders
    from heisd.runtime.policy import VLAPolicy
    from heisd.profiling.loadtest import LoadConfig, run_loadtest
    from heisd.storage import OutputKind, check_output, write_text
    from heisd.storage.guard import json_file_with
    from heisd.targets import load_target

    report_kind = OutputKind("loadtest report", json_file_with("server", "method", "demos"))
    if args.out:
        check_output(Path(args.out), report_kind, args.overwrite)

    if urlsplit(args.server).netloc.rsplit(":", 1)[0] not in LOOPBACK:
        raise SystemExit(f"--server {args.server}: not a loopback address; the overhead is measured against "
                         "decoding on this machine")
    try:
        cfg = LoadConfig(args.clients, args.requests, args.time_limit)
    except ValueError:
        raise SystemExit("--clients, --requests and --time-limit must be positive") from None
    try:
        info = PolicyClient(args.server).info()
    except ServerUnreachable as err:
        raise SystemExit(f"--server: {err}") from None
    served = info.get("protocols", ["rest"])
    protocols = served if args.protocol == "served" else [args.protocol]
    if not set(protocols) <= set(served):
        raise SystemExit(f"--protocol {args.protocol}: the server serves {', '.join(served)} (serve --protocol)")
    base = args.server.rstrip("/")
    urls = {name: base if name == "rest" else "ws" + base.removeprefix("http") for name in protocols}
    target = info["target"]
    vla = load_target(target["path"])
    if vla.fingerprint() != target["fingerprint"]:
        raise SystemExit(f"{target['path']}: not the server's target (fingerprints differ); run the loadtest "
                         "from the server's working directory")
    torch.set_num_threads(target["torch_threads"])  # decode in process as the server does
    policy = VLAPolicy(vla, build_decoders(MethodConfig(**info["method_config"]), vla))
    episodes = []
    for path in args.demos:
        with DemoFile(path, views=vla.spec.views) as f:  # a two-camera target's requests send both
            episodes += list(f)
    report = {"server": args.server, "method": info["method"], "target": target["path"], "demos": args.demos,
              "protocols": protocols, "torch_threads": torch.get_num_threads(),
              **run_loadtest(urls, policy, vla.spec.chunk, episodes, cfg)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        write_text(Path(args.out), text + "\n")
    return 0
