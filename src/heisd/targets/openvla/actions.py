"""OpenVLA's token <-> action mapping: the shared bins plus its per-dimension normalization mask.

Decoding is `predict_action`'s: bin index `clip(vocab - id - 1, 0, n_bins - 2)` into the bin
centers, then `0.5 * (v + 1) * (q99 - q01) + q01` where the mask is set and the normalized
value itself where it is not (the gripper). Encoding is the inverse its data pipeline
uses (normalize where masked, clip to [-1, 1], digitize), for datastore payloads.
"""

from __future__ import annotations

import numpy as np

from heisd.targets.vla.action_tokenizer import ActionTokenizer

_EPS = 1e-8  # OpenVLA's data pipeline guard against q99 == q01 (encoding only, as there)


class OpenVLAActionTokenizer(ActionTokenizer):
    # predict_action's float64: LIBERO's simulator receives these numbers (float32 moves the end effector
    # by ~5e-9 within 30 steps of an episode)
    action_dtype = np.float64

    def __init__(self, vocab_size: int, q01: np.ndarray, q99: np.ndarray, mask: np.ndarray, n_bins: int):
        super().__init__(vocab_size, q01, q99, n_bins)
        self.mask = np.asarray(mask, dtype=bool)
        if self.mask.shape != self.q01.shape:
            raise ValueError(f"mask {self.mask.shape} does not match q01 {self.q01.shape}")

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        a = np.asarray(actions, dtype=np.float64)
        scaled = 2.0 * (a - self.q01) / (self.q99 - self.q01 + _EPS) - 1.0
        return np.clip(np.where(self.mask, scaled, a), -1.0, 1.0)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        v = np.asarray(normalized, dtype=np.float64)
        return np.where(self.mask, 0.5 * (v + 1.0) * (self.q99 - self.q01) + self.q01, v)
