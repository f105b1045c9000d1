"""Kinematic fused metric F (docs/design.md §2.9): how straight (R) and how far (D) the end effector
moved over the last w steps, each min-max normalized with demonstration statistics."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from heisd.errors import InputError

STILL_EPS = 1e-9  # metres: a window whose points spread less than this did not move
COLLINEAR_EPS = 1e-6  # second singular value / first below this: a straight segment
# the tracker's singular values from running sums are off by up to ~1e-7 of the summed points'
# extent (rounding of sums of squares); a window within this much of a test is measured on its points
_SUMS_ROUNDING = 1e-6


@dataclass(frozen=True)
class KinematicConfig:
    alpha: float = 0.5  # weight of Norm(R); 1 - alpha weighs Norm(D)
    window: int = 15  # w, end-effector positions per window
    r_cap: float = 1.0  # metres; R of straight or near-straight windows (Meta-World reach ~0.5 m)
    threshold: float = 0.5  # F >= threshold -> retrieval SD; calibrate with calibrate_threshold
    refine_iters: int = 10  # geometric refinement steps of the circle center after the Kasa fit

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"KinematicConfig.alpha must be in [0, 1], got {self.alpha}")
        if self.window < 3:
            raise ValueError(f"KinematicConfig.window must be >= 3 (a circle needs 3 points), got {self.window}")
        if not self.r_cap > 0.0:
            raise ValueError(f"KinematicConfig.r_cap must be > 0, got {self.r_cap}")
        if not self.threshold >= 0.0:
            raise ValueError(f"KinematicConfig.threshold must be >= 0, got {self.threshold}")
        if self.refine_iters < 0:
            raise ValueError(f"KinematicConfig.refine_iters must be >= 0, got {self.refine_iters}")


def path_length(points: np.ndarray) -> float:
    """D[w]: summed step lengths, direction ignored."""
    return float(np.linalg.norm(np.diff(points, axis=0), axis=1).sum())


def _kasa_center(xy: np.ndarray) -> np.ndarray:
    # Algebraic fit: x^2 + y^2 = 2 a x + 2 b y + c is linear in (a, b, c); (a, b) is the center.
    # Its residual |p - center|^2 - R^2 does not change under translation, so the points are
    # centered first: the normal equations' c row drops out, leaving a 2x2 solve (plain floats).
    points = np.asarray(xy, dtype=np.float64).tolist()
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sxy = syy = sxr = syr = 0.0
    for px, py in points:
        x, y = px - mx, py - my
        r = x * x + y * y
        sxx, sxy, syy, sxr, syr = sxx + x * x, sxy + x * y, syy + y * y, sxr + x * r, syr + y * r
    det = sxx * syy - sxy * sxy
    if not det > 0.0:  # collinear points: no circle (the callers test straightness before)
        return np.array([mx, my])
    a = (syy * sxr - sxy * syr) / (2.0 * det)
    b = (sxx * syr - sxy * sxr) / (2.0 * det)
    return np.array([mx + a, my + b])


def _refine_center(xy: np.ndarray, center: np.ndarray, iters: int) -> np.ndarray:
    # Fixed point of the geometric fit min sum (|p_i - c| - r)^2 with r = mean |p_i - c|
    # (Spath's iteration): c = mean(p) + r * mean((c - p_i) / |c - p_i|). Kasa is biased
    # on short noisy arcs; this removes most of that bias in a few steps.
    # Plain complex arithmetic: on a window's 15 points numpy's per-call overhead costs 4x more.
    points = [complex(x, y) for x, y in np.asarray(xy, dtype=np.float64).tolist()]
    n = len(points)
    mean = sum(points) / n
    c = complex(float(center[0]), float(center[1]))
    for _ in range(iters):
        spread, pull = 0.0, 0j
        for p in points:
            offset = c - p
            dist = max(abs(offset), 1e-12)
            spread += dist
            pull += offset / dist
        c = mean + (spread / n) * (pull / n)
    return np.array([c.real, c.imag])


def curvature_radius(points: np.ndarray, r_cap: float, refine_iters: int = 10) -> float:
    """R[w]: mean distance of the window's points, projected onto their principal plane, to
    the center of the best-fitting circle. Straight windows give r_cap; a window without
    motion gives 0 (the finest motion there is, so F leans to the drafter)."""
    centered = points - points.mean(axis=0)
    _, singular, vt = np.linalg.svd(centered, full_matrices=False)
    if singular[0] < STILL_EPS:
        return 0.0
    if singular[1] < COLLINEAR_EPS * singular[0]:
        return r_cap
    xy = centered @ vt[:2].T
    center = _refine_center(xy, _kasa_center(xy), refine_iters)
    radius = float(np.linalg.norm(xy - center, axis=1).mean())
    return min(radius, r_cap) if math.isfinite(radius) else r_cap


@dataclass(frozen=True)
class KinematicStats:
    """Per-benchmark normalization statistics of R and D, from demonstration windows."""

    r_min: float
    r_p95: float
    d_min: float
    d_p95: float
    window: int  # the w and r_cap they were computed with; F is meaningless under others
    r_cap: float
    n_windows: int

    @classmethod
    def fit(cls, trajectories: Sequence[np.ndarray], config: KinematicConfig) -> KinematicStats:
        """Slide a window (stride 1) over every [T, 3] end-effector trajectory."""
        rs, ds = [], []
        for traj in trajectories:
            traj = np.asarray(traj, dtype=np.float64)
            for start in range(len(traj) - config.window + 1):
                win = traj[start : start + config.window]
                rs.append(curvature_radius(win, config.r_cap, config.refine_iters))
                ds.append(path_length(win))
        if not rs:
            raise InputError(f"no demonstration episode has the {config.window} steps one kinematic window needs")
        return cls(
            r_min=float(np.min(rs)),
            r_p95=float(np.percentile(rs, 95)),
            d_min=float(np.min(ds)),
            d_p95=float(np.percentile(ds, 95)),
            window=config.window,
            r_cap=config.r_cap,
            n_windows=len(rs),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KinematicStats:
        ints = ("window", "n_windows")
        values: dict[str, Any] = {f.name: (int if f.name in ints else float)(data[f.name]) for f in fields(cls)}
        return cls(**values)

    def check(self, config: KinematicConfig) -> None:
        if (self.window, self.r_cap) != (config.window, config.r_cap):
            raise ValueError(
                f"stats were fit with window={self.window}, r_cap={self.r_cap}; "
                f"config has window={config.window}, r_cap={config.r_cap}"
            )


def normalize(value: float, low: float, high: float) -> float:
    """Min-max scaling clipped at the 95th percentile `high`: [0, 1]."""
    if high <= low:  # degenerate statistics: anything above the minimum counts as maximal
        return 0.0 if value <= low else 1.0
    return float(np.clip((value - low) / (high - low), 0.0, 1.0))


def fused_metric(points: np.ndarray, stats: KinematicStats, config: KinematicConfig) -> float:
    """F[w] = alpha * Norm(R[w]) + (1 - alpha) * Norm(D[w]) over the given window."""
    points = np.asarray(points, dtype=np.float64)
    r = curvature_radius(points, config.r_cap, config.refine_iters)
    norm_r = normalize(r, stats.r_min, stats.r_p95)
    norm_d = normalize(path_length(points), stats.d_min, stats.d_p95)
    return config.alpha * norm_r + (1.0 - config.alpha) * norm_d


def fit_delta_scale(trajectories: Sequence[np.ndarray], actions: Sequence[np.ndarray]) -> float | None:
    """Metres the end effector moves per unit of an action's first three values, fitted (least
    squares through the origin) over demonstrations: `trajectories[i]` [T, 3] positions and
    `actions[i]` [T, >=3] the actions executed there (step t moves t -> t+1). What a tracker
    integrates when a client sends no position; None when the actions never move (no fit)."""
    num = den = 0.0
    for ee, act in zip(trajectories, actions, strict=True):
        moved, commanded = np.diff(np.asarray(ee, np.float64)[:, :3], axis=0), np.asarray(act, np.float64)[:-1, :3]
        num += float((moved * commanded).sum())
        den += float((commanded * commanded).sum())
    return num / den if den > 0 and num > 0 else None


class TrajectoryTracker:
    """End-effector positions of the current episode, last `config.window` kept.

    Each step call `update(ee_pos=...)` with the robot's proprioception when the environment
    gives it, else `update(delta=...)` with the executed action: its first three values
    times `delta_scale` (the env's metres per unit action) are added to the last position.

    F is kept incrementally: each update adds the new position to running sums (the path
    length D, the first and second moments of the window's points) and takes the oldest out,
    O(1) per step; `fused()` reads the principal plane from the 3x3 scatter matrix those sums
    give. Only the circle fit reads the window's points (Kasa's normal equations and the
    geometric refinement are per point). The sums are relative to an anchor point and rebuilt
    from the window every `window` updates, so rounding cannot drift over an episode.
    It equals `fused_metric` over the same window to rounding.
    """

    def __init__(self, config: KinematicConfig, stats: KinematicStats, delta_scale: float | None = None) -> None:
        stats.check(config)
        self.config, self.stats, self.delta_scale = config, stats, delta_scale
        # plain float triples: an update runs every env step, F only when a decision needs it
        self._points: deque[tuple[float, float, float]] = deque(maxlen=config.window)
        self._steps: deque[float] = deque(maxlen=config.window - 1)  # |p_t - p_{t-1}| inside the window
        self._fused: float | None = None  # F of the current window, computed once when asked
        self._stale = True
        self._rebuild((0.0, 0.0, 0.0))

    def _rebuild(self, anchor: tuple[float, float, float]) -> None:
        """Running sums from the kept points, relative to `anchor`."""
        self._anchor = anchor
        self._s1 = [0.0] * 3  # sum of q (q = point - anchor)
        self._s2 = [0.0] * 6  # sum of q q^T: xx xy xz yy yz zz
        self._magnitude = 0.0  # sum of |q|^2 over every point added since: bounds the sums' rounding
        for point in self._points:
            self._add(point, 1.0)
        self._length = math.fsum(self._steps)
        self._since_rebuild = 0

    def _add(self, point: tuple[float, float, float], sign: float) -> None:
        ax, ay, az = self._anchor
        x, y, z = point[0] - ax, point[1] - ay, point[2] - az
        s1, s2 = self._s1, self._s2
        s1[0] += sign * x
        s1[1] += sign * y
        s1[2] += sign * z
        s2[0] += sign * x * x
        s2[1] += sign * x * y
        s2[2] += sign * x * z
        s2[3] += sign * y * y
        s2[4] += sign * y * z
        s2[5] += sign * z * z
        if sign > 0:
            self._magnitude += x * x + y * y + z * z

    def reset(self, ee_pos: Sequence[float] | None = None) -> None:
        """New episode; `ee_pos` seeds the start (integration starts at the origin otherwise:
        F depends only on relative positions)."""
        self._points.clear()
        self._steps.clear()
        self._rebuild((0.0, 0.0, 0.0))
        self._stale = True
        if ee_pos is not None:
            self.update(ee_pos=ee_pos)

    def update(self, ee_pos: Sequence[float] | None = None, delta: Sequence[float] | None = None) -> None:
        """Append this step's position (F is computed when asked: a control step asks once,
        however many env steps it executed)."""
        if ee_pos is not None:
            x, y, z = (float(v) for v in ee_pos[:3])
        elif delta is not None:
            if self.delta_scale is None:
                raise ValueError("delta given but the tracker has no delta_scale")
            lx, ly, lz = self._points[-1] if self._points else (0.0, 0.0, 0.0)
            dx, dy, dz = (self.delta_scale * float(v) for v in delta[:3])
            x, y, z = lx + dx, ly + dy, lz + dz
        else:
            raise ValueError("update needs ee_pos or delta")
        if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(z)):
            raise ValueError(f"non-finite end-effector position {[x, y, z]}")
        points, steps = self._points, self._steps
        if points:
            if len(steps) == steps.maxlen:
                self._length -= steps[0]
            step = math.dist(points[-1], (x, y, z))
            steps.append(step)
            self._length += step
        if len(points) == points.maxlen:
            self._add(points[0], -1.0)
        points.append((x, y, z))
        self._since_rebuild += 1
        if self._since_rebuild >= self.config.window:  # amortized O(1): the sums restart from the window
            self._rebuild((x, y, z))
        else:
            self._add((x, y, z), 1.0)
        self._stale = True

    def __len__(self) -> int:
        return len(self._points)

    def fused(self) -> float | None:
        """F over the last w positions, or None while fewer than w exist."""
        if self._stale:
            full = len(self._points) == self.config.window
            self._fused = self._compute() if full else None
            self._stale = False
        return self._fused

    def _compute(self) -> float:
        """F of the full window from the running sums (`curvature_radius` and `path_length`, in the
        same steps)."""
        config, stats = self.config, self.stats
        n = len(self._points)
        s1, s2 = self._s1, self._s2
        mean = np.array(s1) / n
        scatter = np.array([[s2[0], s2[1], s2[2]], [s2[1], s2[3], s2[4]], [s2[2], s2[4], s2[5]]]) - n * np.outer(
            mean, mean
        )
        eigenvalues, vectors = np.linalg.eigh(scatter)  # ascending; singular values of the centered points squared
        first, second = math.sqrt(max(eigenvalues[2], 0.0)), math.sqrt(max(eigenvalues[1], 0.0))
        rounding = _SUMS_ROUNDING * math.sqrt(self._magnitude)
        if first < STILL_EPS + rounding or second < COLLINEAR_EPS * first + rounding:
            # near still or near straight: the sums' rounding (~1e-8 of the window's extent in a
            # singular value) could flip the tests, so decide on the points themselves
            r = curvature_radius(np.array(self._points), config.r_cap, config.refine_iters)
        else:
            xy = (np.array(self._points) - (np.array(self._anchor) + mean)) @ vectors[:, [2, 1]]
            center = _refine_center(xy, _kasa_center(xy), config.refine_iters)
            radius = float(np.linalg.norm(xy - center, axis=1).mean())
            r = min(radius, config.r_cap) if math.isfinite(radius) else config.r_cap
        norm_r = normalize(r, stats.r_min, stats.r_p95)
        norm_d = normalize(max(self._length, 0.0), stats.d_min, stats.d_p95)
        return config.alpha * norm_r + (1.0 - config.alpha) * norm_d
