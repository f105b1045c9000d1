"""Retrieval side of HeiSD: the demonstration datastore and its vector index (DESIGN 2.1)."""

from heisd.retrieval.datastore import Datastore, DatastoreWriter, RetrievalResult
from heisd.retrieval.entries import GLOBAL_COLLECTION
from heisd.retrieval.index import IndexConfig, benchmark_index
from heisd.retrieval.manifest import FORMAT_VERSION, DatastoreError

__all__ = ["Datastore", "DatastoreError", "DatastoreWriter", "FORMAT_VERSION", "GLOBAL_COLLECTION",
           "IndexConfig", "RetrievalResult", "benchmark_index"]
