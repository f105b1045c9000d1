"""SIGTERM as an exception, like SIGINT's KeyboardInterrupt: `finally` blocks and context
managers then run on either, so temporaries are removed and locks released before exit."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (a KeyboardInterrupt, so code that stops on Ctrl-C stops on it too)."""

    signum = signal.SIGTERM


def _raise(signum, frame) -> None:
    raise Terminated()


@contextmanager
def raise_on_sigterm() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises `Terminated`."""
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
