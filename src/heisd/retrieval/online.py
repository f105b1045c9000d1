"""Merging a run's online-adapted skip thresholds into the datastore manifest (`--persist-thresholds`).

A run adapts theta in memory from the manifest record it started with (`AdaptiveThreshold.source`).
The merge applies the run's change (end theta - start theta) to the manifest's theta as it is now,
under the datastore's lock, and adds the run's update count: two runs that persist both count,
and neither overwrites the other. A record recalibrated since the run started is left alone (the
change was relative to a calibration that no longer holds): that is an error, as is a record
that was never calibrated.
"""

from __future__ import annotations

from collections.abc import Sequence

from heisd.errors import UsageError
from heisd.retrieval.datastore import Datastore
from heisd.retrieval.manifest import MANIFEST, DatastoreError
from heisd.retrieval.verify_skip import AdaptiveThreshold, calibrated_floor, clip_theta

ONLINE_FIELDS = ("theta", "online_updates")  # what online updates change in a record; the rest is its calibration


def calibration_of(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ONLINE_FIELDS}


def check_persistable(skips: Sequence[AdaptiveThreshold]) -> None:
    """Before a run: `--persist-thresholds` needs skips that started from a calibration."""
    if not skips:
        raise UsageError(
            "--persist-thresholds: this method adapts no skip threshold "
            "(use --method retrieval or heisd, with verify-skip or prefill skip)"
        )
    for skip in skips:
        if "calibrated_theta" not in skip.source:
            raise UsageError(
                f"--persist-thresholds: the datastore has no calibrated {skip.extras_key} (run heisd calibrate first)"
            )


def persist_thresholds(datastore: Datastore, skips: Sequence[AdaptiveThreshold]) -> dict[str, dict]:
    """Merge each skip's change into the manifest; returns the records as written."""
    check_persistable(skips)

    def edit(extras: dict) -> dict:
        for skip in skips:
            if skip.theta_floor > 1.0:  # never skipping (calibration unsupported): nothing learnt to merge
                continue
            now = extras.get(skip.extras_key)
            if now is None or calibration_of(now) != calibration_of(skip.source):
                raise DatastoreError(
                    datastore.root / MANIFEST,
                    f"{skip.extras_key} was recalibrated since this "
                    "run started; the run's online thresholds were not stored",
                )
            theta = now["theta"] + skip.theta - skip.source["theta"]
            extras[skip.extras_key] = {
                **now,
                "theta": clip_theta(theta, calibrated_floor(now)),
                "online_updates": int(now.get("online_updates", 0)) + skip.updates,
            }
        return extras

    extras = datastore.edit_extras(edit)
    return {skip.extras_key: extras[skip.extras_key] for skip in skips}
