"""Speculative decoding engine: draft trees, the target as verifier, acceptance rules, one loop."""

from heisd.decoding.acceptance import (
    Acceptance,
    AcceptanceRule,
    ExactAcceptance,
    GroupRelaxedAcceptance,
    TokenRelaxedAcceptance,
)
from heisd.decoding.jacobi import JacobiProposer, JacobiStepStats
from heisd.decoding.loop import (
    DecodeConfig,
    DecodeResult,
    DecodeState,
    Outcome,
    Proposal,
    Proposer,
    SpeculativeDecoder,
    Timing,
)
from heisd.decoding.tree import DraftTree
from heisd.decoding.verifier import Prefill, Verification, Verifier
from heisd.decoding.vocab import ActionVocab

__all__ = [
    "Acceptance",
    "AcceptanceRule",
    "ActionVocab",
    "DecodeConfig",
    "DecodeResult",
    "DecodeState",
    "DraftTree",
    "ExactAcceptance",
    "GroupRelaxedAcceptance",
    "JacobiProposer",
    "JacobiStepStats",
    "Outcome",
    "Prefill",
    "Proposal",
    "Proposer",
    "SpeculativeDecoder",
    "Timing",
    "TokenRelaxedAcceptance",
    "Verification",
    "Verifier",
]
