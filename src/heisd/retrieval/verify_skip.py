"""Adaptive verify-skip (docs/design.md §2.5): accept a retrieved draft with no verify pass when the
target's current lm_head-input feature is close to the one stored with the top-1 result.

Skip when cosine(prefill hidden, stored hidden) >= theta AND the retrieved sequence agrees
with the tokens already emitted (the prefill's free greedy first token: a skipped draft is
checked on its first token at no cost). theta is calibrated offline (`calibrate_theta`: the smallest
threshold whose skipped held-out frames are at least `min_support` and pass with a Wilson lower
confidence bound >= the precision target; else never skip), stored with that support in the
datastore manifest under `extras["verify_skip"]`, and adapted online after each episode
in memory: the datastore is read-only at run time. A run keeps its adapted thetas in its own
folder; `heisd.retrieval.online` merges them into the manifest only when asked to.

Prefill skip (ours, docs/design.md §2.6): the same test one step earlier, on the retrieval key.
When the cosine similarity of the current image feature to the top-1 entry's is >= its own
theta, the top-1 sequence is the whole action and the target does not run at all (no prefill):
the step costs vision + one query. Calibrated the same way (its drafts must pass the group-relaxed
check on every position, the first included, since no free first token exists), adapted
online, stored under `extras["prefill_skip"]`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from heisd.decoding import AcceptanceRule, ActionVocab, DecodeState, DraftTree, Proposal
from heisd.retrieval.datastore import Datastore

EXTRAS_KEY = "verify_skip"
PREFILL_SKIP_KEY = "prefill_skip"
# Above every cosine similarity: a theta that never skips (precision target unattainable).
NEVER_SKIP = float(np.nextafter(1.0, 2.0))
MIN_SUPPORT = 20  # held-out frames a calibrated theta must skip
CONFIDENCE = 0.95  # one-sided level of the lower bound on the skipped frames' precision

log = logging.getLogger(__name__)


def cosine(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Cosine similarity in float64, clipped to [-1, 1] (float32 rounding can exceed 1)."""
    a = np.asarray(a.detach().double().cpu() if isinstance(a, torch.Tensor) else a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(np.clip(a @ b / denom, -1.0, 1.0)) if denom > 0 else 0.0


def calibrated_floor(record: dict) -> float:
    """The lowest theta online updates may reach: the calibrated one (0.5 when uncalibrated;
    `NEVER_SKIP` when the calibration could not support a skip: online updates keep it off)."""
    return float(np.clip(record.get("calibrated_theta", 0.5), 0.0, NEVER_SKIP))


def clip_theta(theta: float, floor: float) -> float:
    """theta within [floor, 1]; a never-skip floor keeps theta at never-skip."""
    return float(np.clip(theta, floor, max(floor, 1.0)))


class AdaptiveThreshold:
    """A similarity threshold theta adapted in memory by task outcomes, starting from the
    datastore manifest's `extras[extras_key]` record."""

    extras_key = ""

    def __init__(
        self, theta: float, eta: float = 0.01, theta_floor: float = 0.5, *, source: dict | None = None
    ) -> None:
        if not eta > 0 or not 0.0 <= theta_floor <= NEVER_SKIP:
            raise ValueError(f"need eta > 0 and theta_floor in [0, 1] (or NEVER_SKIP), got {eta}, {theta_floor}")
        self.theta, self.eta, self.theta_floor = float(theta), float(eta), float(theta_floor)
        self.source = dict(source or {})  # the manifest record theta started from ({} if none)
        self.updates = 0  # online updates since `source`
        self.last_similarity: float | None = None

    @classmethod
    def from_datastore(cls, datastore: Datastore, eta: float = 0.01, theta_floor: float | None = None):
        """theta as calibrated / last adapted for this datastore; never skip when uncalibrated.

        The floor defaults to the calibrated theta: failures make skipping more cautious and
        successes relax it back, never below the held-out precision guarantee. (With the paper's
        rule alone, a success rate above 2/3 walks theta down without bound.)
        """
        record = datastore.extras.get(cls.extras_key, {})
        if not calibration_trusted(cls.extras_key, datastore.extras):  # an older calibration's unsupported theta
            return cls(NEVER_SKIP, eta, NEVER_SKIP, source=record)
        theta = record.get("theta", NEVER_SKIP)
        if theta_floor is None:
            theta_floor = calibrated_floor(record)
        return cls(theta, eta, theta_floor, source=record)

    def update(self, success: bool) -> float:
        """After an episode: success -> theta - eta, failure -> theta + 2 eta, clipped to [theta_floor, 1]."""
        step = -self.eta if success else 2.0 * self.eta
        self.theta = clip_theta(self.theta + step, self.theta_floor)
        self.updates += 1
        return self.theta

    def state(self) -> dict:
        """What a run folder keeps after each episode, to resume from."""
        return {"theta": self.theta, "updates": self.updates}

    def restore(self, state: dict) -> None:
        self.theta, self.updates = float(state["theta"]), int(state["updates"])


class VerifySkip(AdaptiveThreshold):
    extras_key = EXTRAS_KEY

    def proposal(
        self, state: DecodeState, stored_hidden: np.ndarray, sequence: Sequence[int], vocab: ActionVocab
    ) -> Proposal | None:
        """The rest of `sequence` as a skip-verify chain, or None when it must be verified."""
        s = self.last_similarity = cosine(state.prefill_hidden, stored_hidden)
        tokens = [int(t) for t in sequence]
        rest = tokens[state.position :]
        if s < self.theta or tokens[: state.position] != list(state.emitted) or not rest:
            return None
        if not all(vocab.is_action(t) for t in rest):  # a blind accept must be an action
            return None
        return Proposal(DraftTree.chain(rest), skip_verify=True)


class PrefillSkip(AdaptiveThreshold):
    extras_key = PREFILL_SKIP_KEY

    def tokens(self, key_similarity: float, sequence: Sequence[int], vocab: ActionVocab) -> list[int] | None:
        """The whole `sequence` as the action when the top-1 key is similar enough, else None."""
        # float32 cosines can exceed 1 by rounding: clip, so a theta above 1 never skips
        key_similarity = self.last_similarity = min(float(key_similarity), 1.0)
        tokens = [int(t) for t in sequence]
        if key_similarity < self.theta or not tokens or not all(vocab.is_action(t) for t in tokens):
            return None
        return tokens


def wilson_lower_bound(passed: np.ndarray | int, n: np.ndarray | int, confidence: float = CONFIDENCE) -> np.ndarray:
    """One-sided Wilson score lower bound on a pass rate from `passed` of `n` (0 where n = 0).
    confidence 0.5 gives the plain rate passed / n."""
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    z = NormalDist().inv_cdf(confidence)
    k, m = np.asarray(passed, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = k / m
        centre = p + z * z / (2 * m)
        spread = z * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
        bound = (centre - spread) / (1 + z * z / m)
    return np.where(m > 0, np.clip(bound, 0.0, 1.0), 0.0)


@dataclass(frozen=True)
class SkipThreshold:
    """A calibrated theta and the held-out support behind it (stored next to theta)."""

    theta: float  # NEVER_SKIP when no threshold qualifies
    skipped: int  # held-out frames with similarity >= theta (0 when never skipping)
    passed: int  # ... whose draft passed the check
    lower_bound: float | None  # Wilson lower bound on their precision (None when never skipping)
    confidence: float
    min_support: int
    frames: int  # held-out frames the candidates came from
    reason: str | None = None  # why no threshold qualified (None when one did)

    def support(self) -> dict[str, Any]:
        """The manifest record's `support` entry."""
        return {
            "skipped": self.skipped,
            "passed": self.passed,
            "lower_bound": self.lower_bound,
            "confidence": self.confidence,
            "min_support": self.min_support,
            "frames": self.frames,
        }


def calibrate_theta(
    similarities: np.ndarray,
    passes: np.ndarray,
    precision: float = 0.95,
    *,
    min_support: int = MIN_SUPPORT,
    confidence: float = CONFIDENCE,
) -> SkipThreshold:
    """Smallest theta whose skipped drafts (similarity >= theta) number at least `min_support` and
    pass with a Wilson lower bound (one-sided, `confidence`) >= `precision`.

    `similarities[i]`: cosine similarity on held-out frame i where the skip's guards hold
    (other frames never skip, whatever theta); `passes[i]`: the retrieved draft passes
    the group-relaxed check against the target's greedy tokens. Candidates are the observed
    similarities. theta is `NEVER_SKIP` (> 1), with the reason, when none qualifies: a
    precision seen on a handful of frames is no evidence (one passing frame is "precision 1").
    `min_support=1, confidence=0.5` is the plain empirical rule.
    """
    s = np.asarray(similarities, dtype=np.float64).ravel()
    ok = np.asarray(passes, dtype=bool).ravel()
    if len(s) != len(ok):
        raise ValueError(f"{len(s)} similarities but {len(ok)} pass flags")
    if not 0.0 < precision <= 1.0:
        raise ValueError(f"precision must be in (0, 1], got {precision}")
    if min_support < 1:
        raise ValueError(f"min_support must be >= 1, got {min_support}")

    def never(reason: str) -> SkipThreshold:
        return SkipThreshold(NEVER_SKIP, 0, 0, None, confidence, min_support, len(s), reason)

    if len(s) == 0:
        return never("no held-out frame can skip")
    order = np.argsort(-s, kind="stable")
    s, ok = s[order], ok[order]
    passed, skipped = np.cumsum(ok), np.arange(1, len(s) + 1)
    whole_ties = np.r_[s[1:] != s[:-1], True]  # theta = s[i] skips every frame tied with s[i]
    bound = wilson_lower_bound(passed, skipped, confidence)
    good = whole_ties & (skipped >= min_support) & (bound >= precision - 1e-9)
    if good.any():
        i = int(np.flatnonzero(good).max())
        return SkipThreshold(
            float(s[i]), int(skipped[i]), int(passed[i]), float(bound[i]), confidence, min_support, len(s)
        )
    supported = whole_ties & (skipped >= min_support)
    pool = supported if supported.any() else whole_ties
    best = int(np.flatnonzero(pool)[np.argmax(bound[pool])])
    reason = (
        f"{len(s)} held-out frames can skip; the best {confidence:.0%} lower bound on precision is "
        f"{bound[best]:.3f} ({passed[best]}/{skipped[best]} pass at theta {s[best]:.4f}), below {precision}"
        + ("" if supported.any() else f", and no theta skips the {min_support} frames required")
    )
    return never(reason)


def support_of(theta: float, similarities: np.ndarray, passes: np.ndarray, confidence: float = CONFIDENCE) -> dict:
    """(skipped, passed, lower bound) of a given theta on held-out frames: an older record's support."""
    skip = np.asarray(similarities, dtype=np.float64) >= theta
    n, k = int(skip.sum()), int(np.asarray(passes, dtype=bool)[skip].sum())
    return {
        "skipped": n,
        "passed": k,
        "lower_bound": float(wilson_lower_bound(k, n, confidence)) if n else None,
        "confidence": confidence,
    }


# the per-frame numbers (`calibration_frames` in extras) each skip was calibrated on: (similarity, passes, guard)
FRAME_COLUMNS = {
    EXTRAS_KEY: ("similarity", "passes", "guard"),
    PREFILL_SKIP_KEY: ("key_similarity", "passes_full", "gripper_kept"),
}


def calibration_trusted(key: str, extras: dict) -> bool:
    """Whether the manifest record of skip `key` may skip. A record from a calibration that stored
    no support is re-checked on its stored frames: trusted when its calibrated theta meets today's
    rule (`MIN_SUPPORT` frames, Wilson bound >= its precision target), else the skip stays off
    until `heisd calibrate` is rerun. Logged either way."""
    record = extras.get(key, {})
    if "calibrated_theta" not in record or "support" in record or record["calibrated_theta"] > 1.0:
        return True
    frames = extras.get("calibration_frames", {})
    sims, passes, guard = FRAME_COLUMNS[key]
    support = None
    if sims in frames and passes in frames:
        s = np.asarray(frames[sims], dtype=np.float64)
        ok = np.asarray(frames[passes], dtype=bool)
        keep = np.asarray(frames[guard], dtype=bool) if guard in frames else np.ones(len(s), dtype=bool)
        support = support_of(record["calibrated_theta"], s[keep], ok[keep])
    target = float(record.get("precision_target", 0.95))
    bound = support["lower_bound"] if support is not None else None
    trusted = support is not None and support["skipped"] >= MIN_SUPPORT and bound is not None and bound >= target - 1e-9
    what = (
        "no stored frames"
        if support is None
        else f"{support['passed']}/{support['skipped']} stored frames pass, "
        f"{CONFIDENCE:.0%} lower bound {bound or 0.0:.3f}"
    )
    if trusted:
        log.info(
            "%s: calibrated before support was stored; theta %.4f is kept (%s >= %s)",
            key,
            record["calibrated_theta"],
            what,
            target,
        )
    else:
        log.warning(
            "%s: calibrated before support was stored and theta %.4f is not supported (%s; need >= %d "
            "frames and a bound >= %s): never skipping; rerun heisd calibrate",
            key,
            record["calibrated_theta"],
            what,
            MIN_SUPPORT,
            target,
        )
    return trusted


def draft_passes(draft: Sequence[int], greedy: Sequence[int], rule: AcceptanceRule, vocab: ActionVocab) -> bool:
    """Would `rule` accept the whole `draft` against the target's greedy tokens `greedy`
    (both a full action, position 0 included)? The offline check a skipped draft must pass."""
    draft, greedy = [int(t) for t in draft], [int(t) for t in greedy]
    if len(draft) != len(greedy):
        raise ValueError(f"draft has {len(draft)} tokens, greedy {len(greedy)}")
    # target_next[0] is what the target predicts after the root (position 0), [i+1] after node i.
    target_next = torch.tensor(greedy + greedy[-1:], dtype=torch.long)
    return len(rule.select(DraftTree.chain(draft), target_next, 0, vocab).nodes) == len(draft)
