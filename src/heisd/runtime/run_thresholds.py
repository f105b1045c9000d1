"""A run's online skip thresholds live in its own folder; the shared datastore stays read-only.

Each episode line carries the thresholds as they were after that episode, so a resumed run
continues from its last finished episode (crash-consistent with the line itself).
`thresholds.json` holds the manifest records the run started from: a later `--persist-thresholds`
merges the run's change relative to them (`heisd.retrieval.online`), once per run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

from heisd.storage import write_json

log = logging.getLogger(__name__)

THRESHOLDS_FILE = "thresholds.json"
LINE_KEY = "thresholds"  # in an episode line: {extras key: AdaptiveThreshold.state()} after the episode


def start(out: Path, skips: Sequence, done: list[dict]) -> None:
    """Bind `skips` to the run in `out`: the records the run started from (written the first
    time, read back on resume) and the thetas after the last finished episode."""
    if not skips:
        return
    path = Path(out) / THRESHOLDS_FILE
    if path.exists():
        state = json.loads(path.read_text())
        for skip in skips:
            skip.source = state["start"].get(skip.extras_key, skip.source)
    else:
        write_json(path, {"start": {skip.extras_key: skip.source for skip in skips}, "persisted": None})
    last = done[-1].get(LINE_KEY, {}) if done else {}
    for skip in skips:
        if skip.extras_key in last:
            skip.restore(last[skip.extras_key])


def snapshot(skips: Sequence) -> dict:
    return {skip.extras_key: skip.state() for skip in skips}


def persist(out: Path, skips: Sequence, datastore) -> dict:
    """Merge the finished run's change into the datastore manifest, unless this run already did."""
    from heisd.retrieval.online import persist_thresholds

    path = Path(out) / THRESHOLDS_FILE
    state = json.loads(path.read_text())
    if state["persisted"] is None:
        state["persisted"] = persist_thresholds(datastore, skips)
        write_json(path, state)
        what = ", ".join(f"{k} theta {r['theta']:.4f} ({r['online_updates']} updates)"
                         for k, r in state["persisted"].items())
        log.info("stored online thresholds in %s: %s", datastore.root, what)
    return state["persisted"]
