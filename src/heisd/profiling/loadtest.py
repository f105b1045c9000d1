"""Load test of a running `heisd serve` on this machine.

Each client replays demonstration episodes as its own server episode (frames every `chunk`
steps, the end-effector positions in between as `ee_pos`, as `heisd replay` does). The same
steps are first decoded in process with the server's target and method: that gives the
in-process latency the server's overhead is measured against, and the tokens every served
step must reproduce, so a lost or mixed-up session shows as a mismatch.

Three passes: every client's steps in process; one client alone, each step decoded in process
and then served (paired, so the overhead is not blurred by the shared machine's drift);
`clients` at once (throughput, queueing). Bounded by `requests` per client and `time_limit_s`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from heisd.client import PolicyClient, ServerError, ServerUnreachable


@dataclass(frozen=True)
class LoadConfig:
    clients: int = 16  # concurrent clients (threads), each with one open episode at a time
    requests: int = 50  # requests per client
    time_limit_s: float = 300.0  # per pass: no request is sent after this long (the report counts them)

    def __post_init__(self) -> None:
        if self.clients < 1 or self.requests < 1 or not self.time_limit_s > 0:
            raise ValueError(f"need clients >= 1, requests >= 1, time_limit_s > 0, got {self}")


@dataclass(frozen=True)
class PlannedStep:
    reset: bool  # first step of an episode (the client's episode id restarts)
    instruction: str
    task: str
    image: np.ndarray
    state: np.ndarray
    ee_pos: np.ndarray  # env-step positions since the previous step


@dataclass
class Outcome:
    client: int
    index: int
    status: int  # 200, the HTTP error status, or 0 when the server could not be reached
    rtt_ms: float = float("nan")  # client-side round trip
    timing_ms: dict | None = None  # Server-Timing: queue, step, total
    tokens: list[int] | None = None


def plan(episodes: list, clients: int, requests: int, stride: int) -> list[list[PlannedStep]]:
    """Client c replays episodes c, c+1, ... (cyclically) until it has `requests` steps."""
    if not episodes:
        raise ValueError("no demonstration episodes to replay")
    plans = []
    for c in range(clients):
        steps: list[PlannedStep] = []
        e = c
        while len(steps) < requests:
            ep = episodes[e % len(episodes)]
            for t in range(0, len(ep), stride):
                moved = ep.ee_pos[max(t - stride + 1, 0) : t + 1]
                steps.append(PlannedStep(t == 0, ep.instruction, ep.task, ep.images[t], ep.state[t], moved))
            e += 1
        plans.append(steps[:requests])
    return plans


def in_process(policy, plans: list[list[PlannedStep]]) -> tuple[list[list[list[int]]], list[float]]:
    """Every client's steps decoded by one local policy: (tokens per client and step, latencies ms)."""
    tokens, latencies = [], []
    for steps in plans:
        tokens.append([])
        for s in steps:
            if s.reset:
                policy.reset(s.instruction, s.task)
            _, record = policy.act(s.image, s.state, s.ee_pos)
            tokens[-1].append(record.tokens)
            latencies.append(record.latency_ms)
    return tokens, latencies


def drive(url: str, plans: list[list[PlannedStep]], tag: str, time_limit_s: float) -> tuple[list[Outcome], float]:
    """One thread per client, all started together -> (outcomes of the requests sent, wall seconds)."""
    outcomes: list[list[Outcome]] = [[] for _ in plans]
    go = threading.Barrier(len(plans) + 1)
    deadline: list[float] = []

    def client_loop(c: int) -> None:
        client = PolicyClient(url, connect_retries=0)
        episode = f"{tag}-{c}"
        go.wait()
        for i, s in enumerate(plans[c]):
            if time.perf_counter() > deadline[0]:
                break
            out = Outcome(c, i, 0)
            t0 = time.perf_counter()
            try:
                step = client.act(s.image, s.instruction, proprio=s.state, ee_pos=s.ee_pos, episode_id=episode,
                                  reset=s.reset, task=s.task)
                out.status, out.timing_ms, out.tokens = 200, step.timing_ms, step.record["tokens"]
            except ServerError as err:
                out.status = err.status
            except ServerUnreachable:
                pass
            out.rtt_ms = (time.perf_counter() - t0) * 1e3
            outcomes[c].append(out)
        try:
            client.end(episode, success=None)  # no outcome: the loadtest teaches the skips nothing
        except (ServerError, ServerUnreachable):
            pass
        client.close()

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(len(plans))]
    for t in threads:
        t.start()
    deadline.append(time.perf_counter() + time_limit_s)
    start = time.perf_counter()
    go.wait()
    for t in threads:
        t.join()
    return [o for per_client in outcomes for o in per_client], time.perf_counter() - start


def _pct(values, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if len(values) else None


def summarize_pass(outcomes: list[Outcome], wall_s: float, expected: list[list[list[int]]],
                   planned: int) -> dict:
    ok = [o for o in outcomes if o.status == 200]
    timing = lambda key: [o.timing_ms[key] for o in ok]  # noqa: E731
    rtt = [o.rtt_ms for o in ok]
    overhead = [o.rtt_ms - o.timing_ms["queue"] - o.timing_ms["step"] for o in ok]  # all but queue + model
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.status != 200:
            errors[str(o.status)] = errors.get(str(o.status), 0) + 1
    return {
        "requests_planned": planned, "requests_sent": len(outcomes), "ok": len(ok), "errors": errors,
        "mismatched": sum(o.tokens != expected[o.client][o.index] for o in ok),
        "wall_s": round(wall_s, 3), "throughput_rps": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        "rtt_ms": {"p50": _pct(rtt, 50), "p99": _pct(rtt, 99)},
        "queue_ms": {"p50": _pct(timing("queue"), 50), "p99": _pct(timing("queue"), 99)},
        "step_ms": {"p50": _pct(timing("step"), 50), "p99": _pct(timing("step"), 99)},
        "overhead_ms": {"p50": _pct(overhead, 50), "p99": _pct(overhead, 99)},
    }


def paired(url: str, policy, steps: list[PlannedStep], expected: list[list[int]]) -> dict:
    """One client, each step decoded in process and then through the server, in turn."""
    client = PolicyClient(url, connect_retries=0)
    local, rtt, server_total, step_ms, mismatched = [], [], [], [], 0
    for s in steps:
        if s.reset:
            policy.reset(s.instruction, s.task)
        _, record = policy.act(s.image, s.state, s.ee_pos)
        t0 = time.perf_counter()
        served = client.act(s.image, s.instruction, proprio=s.state, ee_pos=s.ee_pos, episode_id="paired",
                            reset=s.reset, task=s.task)
        rtt.append((time.perf_counter() - t0) * 1e3)
        local.append(record.latency_ms)
        server_total.append(served.timing_ms["total"])
        step_ms.append(served.timing_ms["step"])
        mismatched += served.record["tokens"] != expected[len(local) - 1]
    client.end("paired", success=None)
    client.close()
    local, rtt = np.asarray(local), np.asarray(rtt)
    return {
        "requests": len(rtt), "mismatched": mismatched,
        "in_process_ms": {"p50": _pct(local, 50), "p99": _pct(local, 99)},
        "rtt_ms": {"p50": _pct(rtt, 50), "p99": _pct(rtt, 99)},
        # what serving adds to a step: p50 latency through the server minus p50 in-process latency
        "server_overhead_ms": round(float(np.median(rtt) - np.median(local)), 3),
        "paired_overhead_ms": {"p50": _pct(rtt - local, 50), "p99": _pct(rtt - local, 99)},
        # inside the server: body read + decode + queue hand-offs + encode (the step itself excluded)
        "in_server_ms": {"p50": _pct(np.subtract(server_total, step_ms), 50),
                         "p99": _pct(np.subtract(server_total, step_ms), 99)},
    }


def run_loadtest(url: str, policy, stride: int, episodes: list, cfg: LoadConfig) -> dict:
    """`policy`: a local VLAPolicy with the server's target and method (the in-process reference)."""
    plans = plan(episodes, cfg.clients, cfg.requests, stride)
    expected, local_ms = in_process(policy, plans)
    alone = paired(url, policy, plans[0], expected[0])
    loaded, loaded_s = drive(url, plans, "load", cfg.time_limit_s)
    return {
        "config": asdict(cfg),
        "in_process_ms": {"p50": _pct(local_ms, 50), "p99": _pct(local_ms, 99)},
        "one_client": alone,
        "concurrent": summarize_pass(loaded, loaded_s, expected, sum(map(len, plans))),
    }
