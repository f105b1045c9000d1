"""The EAGLE-style draft model of the SpecVLA baseline, its tree proposer and its training."""

from heisd.lazy import lazy_exports

_EXPORTS = {
    "Drafter": "model", "DrafterConfig": "model", "DrafterError": "model", "DrafterTarget": "model",
    "DrafterProposer": "proposer", "TreeConfig": "config",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
