"""Moving statistics over the latest `window` values, cheap to read on the decode hot path, and the
cost rules' retry clock (`Staleness`).

The cost rules (mode switch, retrieval fallback, drafter tree) read their estimates every control
step and learn a few values per step, so each statistic is kept up to date on `add` (a running
sum, a sorted copy of the window) instead of recomputed from the window per read.
Plain Python: numpy's per-call overhead on a few dozen numbers costs more than the arithmetic.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class MovingMedian:
    """Median of the latest `window` values (None while empty), read in O(1): the window is also
    kept sorted (an insert and a delete per `add`, both a bisect and a short memmove in C)."""

    __slots__ = ("_values", "_sorted")

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"a moving window needs >= 1 value, got {window}")
        self._values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def add(self, value: float) -> None:
        values, ordered = self._values, self._sorted
        if len(values) == values.maxlen:
            del ordered[bisect.bisect_left(ordered, values[0])]
        value = float(value)
        values.append(value)
        bisect.insort(ordered, value)

    @property
    def value(self) -> float | None:
        ordered, n = self._sorted, len(self._sorted)
        if not n:
            return None
        half = n // 2
        return ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2

    def __len__(self) -> int:
        return len(self._values)


class MovingMean:
    """Mean of the latest `window` values and the share of them above zero, from running sums.

    `seed`: a prior summary (count, mean, share above zero) of earlier values, e.g. every
    calibration frame of a bin; it fills the window's empty slots (at most `window` of them, at
    its mean) and each value added displaces one, as the oldest value of a full window is."""

    __slots__ = ("_values", "_sum", "_positive", "_seed_count", "_seed_mean", "_seed_share")

    def __init__(self, window: int, seed: tuple[int, float, float] | None = None) -> None:
        if window < 1:
            raise ValueError(f"a moving window needs >= 1 value, got {window}")
        self._values: deque[float] = deque(maxlen=window)
        self._sum = 0.0
        self._positive = 0
        count, mean, share = seed if seed is not None else (0, 0.0, 0.0)
        self._seed_count, self._seed_mean, self._seed_share = min(int(count), window), float(mean), float(share)

    def add(self, value: float) -> None:
        values = self._values
        if len(values) == values.maxlen:
            old = values[0]
            self._sum -= old
            self._positive -= old > 0
        value = float(value)
        values.append(value)
        self._sum += value
        self._positive += value > 0

    def _seeded(self) -> int:
        """Slots the seed still fills."""
        values = self._values
        return min(self._seed_count, values.maxlen - len(values))  # type: ignore[operator]

    def __len__(self) -> int:
        return len(self._values) + self._seeded()

    @property
    def total(self) -> float:
        return self._sum + self._seeded() * self._seed_mean

    @property
    def positive(self) -> float:
        """How many of the values are > 0 (seeded slots count their share)."""
        return self._positive + self._seeded() * self._seed_share


class Staleness(Generic[K]):
    """The cost rules' retry clock: which keys went unseen during the latest `after` events (each
    event sees one key). Keys start as seen at event 0, e.g. a calibration seed."""

    __slots__ = ("after", "_events", "_last")

    def __init__(self, keys: Iterable[K], after: int) -> None:
        self.after = after
        self._events = 0
        self._last = dict.fromkeys(keys, 0)

    def seen(self, key: K) -> list[K]:
        """Count an event that saw `key`; the keys stale after it."""
        self._events += 1
        self._last[key] = self._events
        return [k for k, last in self._last.items() if self._events - last >= self.after]
