"""OpenVLA's action tokenizer: the one place where action bins are computed.

Each action dimension is normalized to [-1, 1] with the dataset's q01/q99 (clipped), then
cut by `np.linspace(-1, 1, n_bins)` edges. Token = `vocab_size - np.digitize(a, edges)`, so
bin `b` is token `vocab_size - 1 - b` and the action ids are the last `n_bins` ids of the
base vocabulary (OpenVLA: 31744..31999 of 32000). Decoding maps a token to one of the
`n_bins - 1` bin centers, exactly as OpenVLA does.
"""

from __future__ import annotations

import numpy as np

from heisd.decoding.vocab import ActionVocab

# OpenVLA's guard against q99 == q01 (a constant action dimension)
_EPS = 1e-8


class ActionTokenizer:
    action_dtype = np.float32  # what `decode` returns

    def __init__(self, vocab_size: int, q01: np.ndarray, q99: np.ndarray, n_bins: int):
        self.vocab_size = int(vocab_size)
        self.n_bins = int(n_bins)
        self.q01 = np.asarray(q01, dtype=np.float64)
        self.q99 = np.asarray(q99, dtype=np.float64)
        if self.q01.shape != self.q99.shape or self.q01.ndim != 1:
            raise ValueError(f"q01 {self.q01.shape} and q99 {self.q99.shape} must be equal 1-d shapes")
        self.vocab = ActionVocab(self.vocab_size, self.n_bins)  # validates the sizes
        self.bins = np.linspace(-1.0, 1.0, self.n_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0

    @property
    def action_dim(self) -> int:
        return int(self.q01.shape[0])

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        x = 2.0 * (np.asarray(actions, dtype=np.float64) - self.q01) / (self.q99 - self.q01 + _EPS) - 1.0
        return np.clip(x, -1.0, 1.0)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        return 0.5 * (np.asarray(normalized, dtype=np.float64) + 1.0) * (self.q99 - self.q01 + _EPS) + self.q01

    def zero_bins(self) -> np.ndarray:
        """[A]: per dimension, the fractional bin whose center is a zero action (bins are
        2 / (n_bins - 1) wide from -1): where a tolerance that scales with the action measures from."""
        width = 2.0 / (self.n_bins - 1)
        return (self.normalize(np.zeros(self.action_dim)) + 1.0) / width - 0.5

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """actions [..., A] (raw units) -> token ids [..., A] int64."""
        actions = np.asarray(actions)
        if actions.shape[-1] != self.action_dim:
            raise ValueError(f"actions have {actions.shape[-1]} dims, tokenizer has {self.action_dim}")
        # digitize gives 1..n_bins for values in [-1, 1]: bin = that - 1
        return self.vocab.token(np.digitize(self.normalize(actions), self.bins) - 1).astype(np.int64)

    def decode(self, ids: np.ndarray) -> np.ndarray:
        """token ids [..., A] -> actions [..., A] (raw units, `action_dtype`) at the bin centers."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape[-1] != self.action_dim:
            raise ValueError(f"ids have {ids.shape[-1]} dims, tokenizer has {self.action_dim}")
        index = np.clip(self.vocab.bin(ids), 0, self.n_bins - 2)
        return self.unnormalize(self.bin_centers[index]).astype(self.action_dtype)
