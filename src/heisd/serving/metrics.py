"""`GET /metrics`: the server's counters in the Prometheus text format, one registry per server
(so two servers in one process, as in the tests, never share counts)."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE

# seconds: from sub-millisecond (a prefill-skipped step on a GPU) to a 7B target on a CPU
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class ServerMetrics:
    content_type = CONTENT_TYPE

    def __init__(self, queue_depth: Callable[[], int], open_episodes: Callable[[], int]):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("heisd_requests", "requests by path and status (openpi's websocket messages: ws)",
                                ["path", "status"], registry=r)
        self.errors = Counter("heisd_errors", "requests answered 4xx/5xx, by path and status",
                              ["path", "status"], registry=r)
        self.request_latency = Histogram("heisd_request_latency_seconds",
                                         "/act and websocket steps: request read to reply ready",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("heisd_queue_wait_seconds",
                                    "/act and websocket steps: time waiting for the model worker",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.step_latency = Histogram("heisd_step_latency_seconds", "policy step (observation in -> action out)",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.steps = Counter("heisd_steps", "control steps by decoding mode", ["mode"], registry=r)
        self.skipped = Counter("heisd_skipped_steps", "steps whose draft was accepted with no verify pass",
                               registry=r)
        self.target_forwards = Counter("heisd_target_forwards", "target forward passes (prefill included)",
                                       registry=r)
        self.action_tokens = Counter("heisd_action_tokens", "action tokens emitted", registry=r)
        Gauge("heisd_queue_depth", "requests waiting for the model worker", registry=r).set_function(queue_depth)
        Gauge("heisd_open_episodes", "episodes (sessions) open", registry=r).set_function(open_episodes)

    def request(self, path: str, status: int) -> None:
        self.requests.labels(path, str(status)).inc()
        if status >= 400:
            self.errors.labels(path, str(status)).inc()

    def step(self, record, queue_ms: float, total_ms: float) -> None:
        """One answered /act: `record` is the policy's StepRecord."""
        self.request_latency.observe(total_ms / 1e3)
        self.queue_wait.observe(queue_ms / 1e3)
        self.step_latency.observe(record.latency_ms / 1e3)
        self.steps.labels(record.mode).inc()
        if record.skipped:
            self.skipped.inc()
        self.target_forwards.inc(record.target_forwards)
        self.action_tokens.inc(len(record.tokens))

    def render(self) -> bytes:
        return generate_latest(self.registry)
