"""Per-piece cost of a target on the current device (`heisd profile`), projections onto another
device (`heisd project`) and the server's load test (`heisd loadtest`)."""

from heisd.lazy import lazy_exports

_EXPORTS = {
    "ProfileConfig": "pieces", "profile_target": "pieces", "random_drafter": "pieces",
    "format_table": "report", "Timing": "timer", "measure": "timer",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
