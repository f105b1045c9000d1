"""Adaptive verify-skip (docs/design.md §2.5): accept a retrieved draft with no verify pass when the
target's current lm_head-input feature is close to the one stored with the top-1 result.

Skip when cosine(prefill hidden, stored hidden) >= theta AND the retrieved sequence agrees
with the tokens already emitted (the prefill's free greedy first token: a skipped draft is
checked on its first token at no cost). theta is calibrated offline (`calibrate_theta`), stored
in the datastore manifest under `extras["verify_skip"]`, and adapted online after each episode
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

from collections.abc import Sequence

import numpy as np
import torch

from heisd.decoding import AcceptanceRule, ActionVocab, DecodeState, DraftTree, Proposal
from heisd.retrieval.datastore import Datastore

EXTRAS_KEY = "verify_skip"
PREFILL_SKIP_KEY = "prefill_skip"
# Above every cosine similarity: a theta that never skips (precision target unattainable).
NEVER_SKIP = float(np.nextafter(1.0, 2.0))


def cosine(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Cosine similarity in float64, clipped to [-1, 1] (float32 rounding can exceed 1)."""
    a = np.asarray(a.detach().double().cpu() if isinstance(a, torch.Tensor) else a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(np.clip(a @ b / denom, -1.0, 1.0)) if denom > 0 else 0.0


def calibrated_floor(record: dict) -> float:
    """The lowest theta online updates may reach: the calibrated one (0.5 when uncalibrated)."""
    return float(np.clip(record.get("calibrated_theta", 0.5), 0.0, 1.0))


class AdaptiveThreshold:
    """A similarity threshold theta adapted in memory by task outcomes, starting from the
    datastore manifest's `extras[extras_key]` record."""

    extras_key = ""

    def __init__(
        self, theta: float, eta: float = 0.01, theta_floor: float = 0.5, *, source: dict | None = None
    ) -> None:
        if not eta > 0 or not 0.0 <= theta_floor <= 1.0:
            raise ValueError(f"need eta > 0 and theta_floor in [0, 1], got {eta}, {theta_floor}")
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
        theta = record.get("theta", NEVER_SKIP)
        if theta_floor is None:
            theta_floor = calibrated_floor(record)
        return cls(theta, eta, theta_floor, source=record)

    def update(self, success: bool) -> float:
        """After an episode: success -> theta - eta, failure -> theta + 2 eta, clipped to [theta_floor, 1]."""
        step = -self.eta if success else 2.0 * self.eta
        self.theta = float(np.clip(self.theta + step, self.theta_floor, 1.0))
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


def calibrate_theta(similarities: np.ndarray, passes: np.ndarray, precision: float = 0.95) -> float:
    """Smallest theta whose skipped drafts (similarity >= theta) pass with precision >= `precision`.

    `similarities[i]`: cosine similarity on held-out frame i where the free first-token guard
    holds (other frames never skip, whatever theta); `passes[i]`: the retrieved draft passes
    the group-relaxed check against the target's greedy tokens. Candidates are the observed
    similarities. Returns `NEVER_SKIP` (> 1) when no theta reaches the precision.
    """
    s = np.asarray(similarities, dtype=np.float64).ravel()
    ok = np.asarray(passes, dtype=bool).ravel()
    if len(s) != len(ok):
        raise ValueError(f"{len(s)} similarities but {len(ok)} pass flags")
    if not 0.0 < precision <= 1.0:
        raise ValueError(f"precision must be in (0, 1], got {precision}")
    if len(s) == 0:
        return NEVER_SKIP
    order = np.argsort(-s, kind="stable")
    s, ok = s[order], ok[order]
    passed, skipped = np.cumsum(ok), np.arange(1, len(s) + 1)
    whole_ties = np.r_[s[1:] != s[:-1], True]  # theta = s[i] skips every frame tied with s[i]
    good = whole_ties & (passed >= precision * skipped - 1e-9)
    return float(s[np.flatnonzero(good).max()]) if good.any() else NEVER_SKIP


def draft_passes(draft: Sequence[int], greedy: Sequence[int], rule: AcceptanceRule, vocab: ActionVocab) -> bool:
    """Would `rule` accept the whole `draft` against the target's greedy tokens `greedy`
    (both a full action, position 0 included)? The offline check a skipped draft must pass."""
    draft, greedy = [int(t) for t in draft], [int(t) for t in greedy]
    if len(draft) != len(greedy):
        raise ValueError(f"draft has {len(draft)} tokens, greedy {len(greedy)}")
    # target_next[0] is what the target predicts after the root (position 0), [i+1] after node i.
    target_next = torch.tensor(greedy + greedy[-1:], dtype=torch.long)
    return len(rule.select(DraftTree.chain(draft), target_next, 0, vocab).nodes) == len(draft)
