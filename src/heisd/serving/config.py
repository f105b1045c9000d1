"""The server's limits, importable without torch (`heisd serve --help` shows them as defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from heisd.serving.sessions import SessionLimits
from heisd.serving.wire import WireLimits


@dataclass(frozen=True)
class ServeConfig:
    queue_size: int = 32  # requests waiting for the model worker; one more is refused with 503
    max_body_bytes: int = 8 << 20  # request body limit (413 above): a 1024x1024 image fits with room
    wire: WireLimits = field(default_factory=WireLimits)
    sessions: SessionLimits = field(default_factory=SessionLimits)
    # control steps run on a synthetic observation before the server listens, so the first episode
    # does not pay for capturing the CUDA graphs of its pass shapes (--cuda-graphs)
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
