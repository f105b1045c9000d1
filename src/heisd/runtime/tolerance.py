"""The acceptance tolerance a target keeps AR's success with: chosen closed loop, stored with the datastore.

Offline frames cannot say whether a relaxed action costs a grasp: the image-only OpenVLA-architecture
target lost episodes AR won at the default tolerance while its calibration frames promised little
(BENCHMARKS 15.9). So the choice is made closed loop. `bench --sampled-layouts --tolerances ...
--persist-tolerance` runs AR and the full HeiSD at each candidate tolerance on layouts LIBERO's
samplers draw (never the evaluation's init states). Of the candidates that succeeded in at least as
many episodes as AR, it keeps the one that lost the fewest of the episodes AR won (a closed loop can
trade one success for another at an equal count), then the fastest. It stores it in the datastore
manifest's extras. Every command that builds a method on that datastore then takes it as its default
`--tolerance`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from heisd.errors import InputError

log = logging.getLogger(__name__)

TOLERANCE_KEY = "tolerance"  # datastore extras: the chosen tolerance and the episodes behind it


@dataclass(frozen=True)
class Candidate:
    tolerance: str  # canonical spec (`Tolerance.spec`)
    successes: int
    episodes: int
    lost: int  # episodes AR won that this candidate did not
    speedup: float  # median-latency speedup over AR in the same run


def choose(ar_successes: int, candidates: Sequence[Candidate]) -> Candidate | None:
    """Of the candidates with at least AR's successes, the one that lost the fewest of AR's episodes,
    then the fastest (None: none kept AR's count)."""
    if ar_successes < 1:
        raise InputError("AR succeeded in no episode: there is no success to keep, so no tolerance can be chosen "
                         "(more episodes, or another target)")
    kept = [c for c in candidates if c.successes >= ar_successes]
    return min(kept, key=lambda c: (c.lost, -c.speedup), default=None)


def candidate_runs(configs: Sequence, full) -> list[int]:
    """Which of a bench's configurations are the full HeiSD `full` (a MethodConfig) at some tolerance."""
    from dataclasses import replace

    return [k for k, mc in enumerate(configs) if replace(mc, tolerance=full.tolerance) == full]


def scored(configs: Sequence, summaries: Sequence[dict], full, out: Path) -> tuple[int, list[Candidate]]:
    """AR's successes and those runs' results, both from their episodes: `summaries` are the bench's in
    `out`, in the order of `configs`, AR's first."""
    from heisd.runtime.evaluation import EPISODES_FILE, read_episodes

    def won(summary: dict) -> set[tuple[str, int]]:
        return {(e["task"], e["episode"]) for e in read_episodes(out / summary["dir"] / EPISODES_FILE) if e["success"]}

    ar_won = won(summaries[0])
    found = []
    for k in candidate_runs(configs, full):
        its = won(summaries[k])
        found.append(Candidate(configs[k].tolerance, len(its), summaries[k]["episodes"], len(ar_won - its),
                               float(summaries[k]["speedup"])))
    return len(ar_won), found


def stored(datastore: str | Path | None) -> str | None:
    """The tolerance stored with `datastore` (None: no datastore, or none chosen for it)."""
    if datastore is None:
        return None
    from heisd.retrieval.config import Tolerance
    from heisd.retrieval.manifest import MANIFEST, DatastoreError, read_manifest

    record = read_manifest(Path(datastore))["extras"].get(TOLERANCE_KEY)
    if record is None:
        return None
    try:
        return Tolerance.parse(str(record["tolerance"])).spec()
    except (TypeError, KeyError, ValueError) as err:
        raise DatastoreError(Path(datastore) / MANIFEST, f"extras {TOLERANCE_KEY!r} holds no usable tolerance "
                             f"({err!r}); run `bench --persist-tolerance` again") from None


def persist(datastore: str | Path, files: dict, ar_successes: int, candidates: Sequence[Candidate],
            run: dict) -> dict:
    """Choose and store; returns the record written. `files`: the manifest's file records as the run
    started (an edit never lands on a datastore rebuilt meanwhile); `run`: where the episodes came from."""
    from heisd.retrieval.manifest import edit_manifest_extras

    best = choose(ar_successes, candidates)
    if best is None:
        tried = ", ".join(f"{c.tolerance} {c.successes}/{c.episodes}" for c in candidates)
        raise InputError(f"no candidate tolerance kept AR's {ar_successes} successes ({tried}); nothing was stored. "
                         "Add stricter candidates (scale=0 accepts exactly) and run again: finished episodes are kept")
    record = {"tolerance": best.tolerance, "ar_successes": ar_successes, **run,
              "candidates": [asdict(c) for c in candidates]}
    edit_manifest_extras(Path(datastore), files, lambda extras: {**extras, TOLERANCE_KEY: record})
    log.info("stored acceptance tolerance %s with %s (%d/%d successes, AR %d, %d of AR's lost; %.2fx)",
             best.tolerance, datastore, best.successes, best.episodes, ar_successes, best.lost, best.speedup)
    return record
