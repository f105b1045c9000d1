"""Retrieval side of HeiSD (docs/design.md): the demonstration datastore and its vector index
(§2.2), retrieval drafts as a sequence-wise group tree (§2.3), adaptive verify-skip (§2.5) and
prefill skip (§2.6)."""

from heisd.lazy import lazy_exports

_EXPORTS = {
    "BuildConfig": "build",
    "build_datastore": "build",
    "open_datastore": "build",
    "Datastore": "datastore",
    "DatastoreWriter": "datastore",
    "RetrievalResult": "datastore",
    "GLOBAL_COLLECTION": "entries",
    "IndexConfig": "index_config",
    "benchmark_index": "index",
    "FORMAT_VERSION": "manifest",
    "DatastoreError": "manifest",
    "RetrievalConfig": "config",
    "action_groups": "config",
    "RetrievalProposer": "proposer",
    "RetrievalStepStats": "proposer",
    "group_tree": "proposer",
    "NEVER_SKIP": "verify_skip",
    "PrefillSkip": "verify_skip",
    "VerifySkip": "verify_skip",
    "calibrate_theta": "verify_skip",
    "draft_passes": "verify_skip",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
