"""Where action tokens sit in the vocabulary: the one place of bin <-> token arithmetic.

OpenVLA's convention: action tokens are the last `n_bins` ids of the base vocabulary and
bin b is token `vocab_size - 1 - b` (OpenVLA: bins 0..255 are ids 31999..31744).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActionVocab:
    vocab_size: int  # base vocab size; the embedding may be padded larger (pad ids are never actions)
    n_bins: int  # action bins per dimension

    def __post_init__(self) -> None:
        if not 0 < self.n_bins <= self.vocab_size:
            raise ValueError(f"need 0 < n_bins <= vocab_size, got {self.n_bins}, {self.vocab_size}")

    @property
    def first_id(self) -> int:
        """The lowest action id (bin n_bins - 1)."""
        return self.vocab_size - self.n_bins

    # Arithmetic only, so these work on ints, numpy arrays and torch tensors alike.
    def is_action(self, token):
        return (token >= self.first_id) & (token < self.vocab_size)

    def bin(self, token):
        return self.vocab_size - 1 - token

    def token(self, bin_index):
        return self.vocab_size - 1 - bin_index
