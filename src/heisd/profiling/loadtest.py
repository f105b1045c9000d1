"""Load test of a running `heisd serve` on this machine, over REST, openpi's websocket, or both.

Each client replays demonstration episodes as its own server episode (frames every `chunk`
steps, the end-effector positions in between as `ee_pos`, as `heisd replay` does). The same
steps are first decoded in process with the server's target and method: that gives the
in-process latency the server's overhead is measured against, and the tokens every served
step must reproduce, so a lost or mixed-up session shows as a mismatch.

Passes: every client's steps in process; one client alone, each step decoded in process and then
served over each protocol, in turn and in alternating order (paired, so the overhead is not
blurred by the shared machine's drift, nor biased toward the protocol served first); `clients`
at once per protocol (throughput, queueing). Bounded by `requests` per client and `time_limit_s`.

Token checks: the default cost switch picks each step's mode from measured timings, and the default
cost fallback picks what finishes a rejected retrieval step (AR, Jacobi or the drafter) the same
way, so a served step may choose otherwise than in process (then its tokens may differ, and so
may later steps' inputs such as the previous action). A served step counts as `different_mode`
when its mode differs, as `different_choice` when the mode is the same but a cost rule chose
another option (the step record's `choices`), and as `mismatched` when mode and choices are the
same and the tokens are not: a real mismatch. With no timing-driven choice (`--switch threshold`
and a fixed `--retrieval-fallback`) all three must be 0.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from heisd.client import ServerError, ServerUnreachable, connect
from heisd.data.views import stack_views


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
    wrist: np.ndarray | None = None  # the wrist camera's frame, for a target that reads it

    @property
    def frame(self) -> np.ndarray:
        """What the target reads in process (the server stacks the two cameras alike)."""
        return self.image if self.wrist is None else stack_views(self.image, self.wrist)


@dataclass
class Outcome:
    client: int
    index: int
    status: int  # 200, the HTTP error status, or 0 when the server could not be reached
    rtt_ms: float = float("nan")  # client-side round trip
    timing_ms: dict | None = None  # Server-Timing: queue, step, total
    tokens: list[int] | None = None
    mode: str | None = None  # the decoding mode the served step ran
    choices: list | None = None  # the cost rules' (rule, option) choices of the served step


@dataclass(frozen=True)
class Expected:
    """A step decoded in process: what the served step is compared with."""

    tokens: list[int]
    mode: str
    choices: list  # (rule, option) of each cost-rule choice (fallback, drafter tree) of the step


def _choices(record_choices) -> list:
    """A step record's cost-rule choices as (rule, option) pairs (CostChoice objects or their dicts)."""
    return [(c["rule"], c["option"]) if isinstance(c, dict) else (c.rule, c.option) for c in record_choices]


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
                wrist = None if ep.wrist_images is None else ep.wrist_images[t]
                steps.append(PlannedStep(t == 0, ep.instruction, ep.task, ep.images[t], ep.state[t], moved, wrist))
            e += 1
        plans.append(steps[:requests])
    return plans


def in_process(policy, plans: list[list[PlannedStep]]) -> tuple[list[list[Expected]], list[float]]:
    """Every client's steps decoded by one local policy: (tokens and mode per client and step, latencies ms)."""
    expected, latencies = [], []
    for steps in plans:
        expected.append([])
        for s in steps:
            if s.reset:
                policy.reset(s.instruction, s.task)
            _, record = policy.act(s.frame, s.state, s.ee_pos)
            expected[-1].append(Expected(record.tokens, record.mode, _choices(record.choices)))
            latencies.append(record.latency_ms)
    return expected, latencies


def drive(url: str, plans: list[list[PlannedStep]], tag: str, time_limit_s: float) -> tuple[list[Outcome], float]:
    """One thread per client, all started together -> (outcomes of the requests sent, wall seconds).
    `url`: http:// for REST, ws:// for openpi's websocket."""
    outcomes: list[list[Outcome]] = [[] for _ in plans]
    go = threading.Barrier(len(plans) + 1)
    deadline: list[float] = []

    def client_loop(c: int) -> None:
        client = connect(url, connect_retries=0)
        episode = f"{tag}-{c}"
        go.wait()
        for i, s in enumerate(plans[c]):
            if time.perf_counter() > deadline[0]:
                break
            out = Outcome(c, i, 0)
            t0 = time.perf_counter()
            try:
                step = client.act(s.image, s.instruction, proprio=s.state, ee_pos=s.ee_pos, episode_id=episode,
                                  reset=s.reset, task=s.task, wrist_image=s.wrist)
                out.status, out.timing_ms = 200, step.timing_ms
                out.tokens, out.mode = step.record["tokens"], step.record["mode"]
                out.choices = _choices(step.record["choices"])
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


def _spread(values) -> dict:
    return {"p50": _pct(values, 50), "p90": _pct(values, 90), "p99": _pct(values, 99)}


def _checks(served: list[tuple[list[int], str, list]], expected: list[Expected]) -> dict:
    """Served (tokens, mode, choices) against the in-process steps: token mismatches apart from
    timing-driven choices."""
    counts = {"mismatched": 0, "different_mode": 0, "different_choice": 0}
    for (tokens, mode, choices), e in zip(served, expected):
        if mode != e.mode:
            counts["different_mode"] += 1
        elif choices != e.choices:
            counts["different_choice"] += 1
        elif tokens != e.tokens:
            counts["mismatched"] += 1
    return counts


def summarize_pass(outcomes: list[Outcome], wall_s: float, expected: list[list[Expected]], planned: int) -> dict:
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
        **_checks([(o.tokens, o.mode, o.choices) for o in ok], [expected[o.client][o.index] for o in ok]),
        "wall_s": round(wall_s, 3), "throughput_rps": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        "rtt_ms": _spread(rtt), "queue_ms": _spread(timing("queue")), "step_ms": _spread(timing("step")),
        "overhead_ms": _spread(overhead),
    }


def paired(urls: dict[str, str], policy, steps: list[PlannedStep]) -> dict:
    """One client per protocol (`urls`: name -> URL): each step decoded in process, then served over
    every protocol, the order of the protocols alternating from step to step. Served steps are
    checked against this pass's in-process steps."""
    clients = {name: connect(url, connect_retries=0) for name, url in urls.items()}
    names = list(clients)
    local: list[float] = []
    expected: list[Expected] = []
    got = {name: {"rtt": [], "step": [], "total": [], "served": []} for name in names}
    for i, s in enumerate(steps):
        if s.reset:
            policy.reset(s.instruction, s.task)
        t0 = time.perf_counter()
        _, record = policy.act(s.frame, s.state, s.ee_pos)
        local.append((time.perf_counter() - t0) * 1e3)
        expected.append(Expected(record.tokens, record.mode, _choices(record.choices)))
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            step = clients[name].act(s.image, s.instruction, proprio=s.state, ee_pos=s.ee_pos,
                                     episode_id=f"paired-{name}", reset=s.reset, task=s.task, wrist_image=s.wrist)
            g = got[name]
            g["rtt"].append((time.perf_counter() - t0) * 1e3)
            g["step"].append(step.timing_ms["step"])
            g["total"].append(step.timing_ms["total"])
            g["served"].append((step.record["tokens"], step.record["mode"], _choices(step.record["choices"])))
    report = {"requests": len(local), "in_process_ms": _spread(local)}
    for name, client in clients.items():
        client.end(f"paired-{name}", success=None)
        client.close()
        g = {k: np.asarray(v) for k, v in got[name].items() if k != "served"}
        same = np.array([(mode, choices) == (e.mode, e.choices)
                         for (_, mode, choices), e in zip(got[name]["served"], expected)], dtype=bool)
        report[name] = {
            **_checks(got[name]["served"], expected),
            "rtt_ms": _spread(g["rtt"]),
            # what serving adds to a step: each served step's round trip minus the same step in process
            "added_ms": _spread(g["rtt"] - np.asarray(local)),
            # the same over the steps that made the same timing-driven choices in both (mode, fallback,
            # tree): a step that ran AR where the other ran Jacobi differs by more than the serving
            "added_ms_same_choices": _spread((g["rtt"] - np.asarray(local))[same]),
            # round trip minus the server's own run of the model step: all the serving costs, free of
            # the step-to-step difference between two decodes of one step
            "outside_step_ms": _spread(g["rtt"] - g["step"]),
            # inside the server: frame or body read -> reply ready, the model step excluded
            "in_server_ms": _spread(g["total"] - g["step"]),
        }
    return report


def run_loadtest(urls: dict[str, str], policy, stride: int, episodes: list, cfg: LoadConfig) -> dict:
    """`urls`: protocol name -> server URL; `policy`: a local VLAPolicy with the server's target and
    method (the in-process reference)."""
    plans = plan(episodes, cfg.clients, cfg.requests, stride)
    expected, local_ms = in_process(policy, plans)
    alone = paired(urls, policy, plans[0])
    concurrent = {}
    for name, url in urls.items():
        loaded, loaded_s = drive(url, plans, f"load-{name}", cfg.time_limit_s)
        concurrent[name] = summarize_pass(loaded, loaded_s, expected, sum(map(len, plans)))
    return {
        "config": asdict(cfg),
        "in_process_ms": _spread(local_ms),
        "one_client": alone,
        "concurrent": concurrent,
    }
