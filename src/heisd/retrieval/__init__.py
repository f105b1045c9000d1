"""Retrieval side of HeiSD (docs/design.md): the demonstration datastore and its vector index
(§2.2), retrieval drafts as a sequence-wise group tree (§2.3), adaptive verify-skip (§2.5) and
prefill skip (§2.6)."""

from heisd.retrieval.build import BuildConfig, build_datastore, open_datastore
from heisd.retrieval.datastore import Datastore, DatastoreWriter, RetrievalResult
from heisd.retrieval.entries import GLOBAL_COLLECTION
from heisd.retrieval.index import IndexConfig, benchmark_index
from heisd.retrieval.manifest import FORMAT_VERSION, DatastoreError
from heisd.retrieval.proposer import RetrievalConfig, RetrievalProposer, RetrievalStepStats, action_groups, group_tree
from heisd.retrieval.verify_skip import NEVER_SKIP, PrefillSkip, VerifySkip, calibrate_theta, draft_passes

__all__ = [
    "BuildConfig",
    "Datastore",
    "DatastoreError",
    "DatastoreWriter",
    "FORMAT_VERSION",
    "GLOBAL_COLLECTION",
    "IndexConfig",
    "NEVER_SKIP",
    "RetrievalConfig",
    "RetrievalProposer",
    "RetrievalResult",
    "PrefillSkip",
    "RetrievalStepStats",
    "VerifySkip",
    "action_groups",
    "benchmark_index",
    "build_datastore",
    "calibrate_theta",
    "draft_passes",
    "group_tree",
    "open_datastore",
]
