"""`heisd project`: a bench run's per-step statistics times a device's profiled per-piece costs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LOCKS_OUT = True  # --out has one writer at a time (see heisd.commands.runner)
HELP = ("Project a bench run's step latencies (mean, median, mode and fallback mix) and speedups onto the device "
        "of a `heisd profile` JSON, with the run's choices and with the cost-based ones re-decided under that "
        "device's costs (labelled a projection; compare with a measured run where one exists).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bench", type=Path, required=True, help="a `heisd bench --out` directory (bench.json + episodes)")
    p.add_argument("--profile", type=Path, required=True,
                   help="a `heisd profile` JSON of the target (with --drafter and --datastore for those pieces)")
    p.add_argument("--datastore", type=Path, default=None,
                   help="the bench's datastore, for the cost switch's calibration when re-deciding its modes "
                        "(default: the path each method's run.json recorded)")
    p.add_argument("--compare", type=Path, default=None,
                   help="a `heisd bench --out` directory of the same methods measured on the profile's device: its "
                        "speedups and mode mix go beside the projected ones, with the error of each")
    p.add_argument("--source-profile", type=Path, default=None,
                   help="a `heisd profile` JSON taken on the device (and thread count) that ran --bench: the vision "
                        "column beyond its vision pass is then carried over as host time, like 'other' always is, "
                        "and where --profile has no datastore query (e.g. a GPU profile without the datastore) its "
                        "query and retrieval proposal, host work, are taken from here")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing projection at --out")


def run(args: argparse.Namespace) -> int:
    from heisd.profiling.projection import PieceCosts, format_projection, project_bench
    from heisd.retrieval.manifest import DatastoreError
    from heisd.storage import OutputKind, check_output, recorded_path, write_json
    from heisd.storage.guard import json_file_with

    if args.out is not None:
        check_output(args.out, OutputKind("projection", json_file_with("projection", "rows")), args.overwrite)
    for flag, path in (("--bench", args.bench), ("--compare", args.compare)):
        if path is not None and not (path / "bench.json").is_file():
            raise SystemExit(f"{flag} {path}: no bench.json there (the output folder of `heisd bench`)")
    try:
        profile = json.loads(args.profile.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--profile {args.profile}: not a readable profile JSON ({e})") from e
    source = None
    if args.source_profile is not None:
        try:
            source = json.loads(args.source_profile.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"--source-profile {args.source_profile}: not a readable profile JSON ({e})") from e
    try:
        rows = project_bench(args.bench, profile, args.datastore, args.compare, source)
    except (KeyError, ValueError, DatastoreError) as e:
        raise SystemExit(f"heisd project: {e}") from e
    print(format_projection(rows, profile))
    bench_target = _bench_target(args.bench)
    if bench_target is not None:  # a small target's steps priced with a 7B's costs must say so
        print(f"\nSteps (modes, drafts, acceptance) from the bench's target {bench_target}; "
              f"costs of the profile's {profile.get('target')}.")
    costs = PieceCosts.from_profile(profile)  # the rule project_bench applied, asked again for the report
    borrowed = source is not None and costs.with_host_pieces(PieceCosts.from_profile(source)) is not costs
    if borrowed:
        print("\nThe datastore query and the retrieval proposal are priced as --source-profile measured them "
              "(host work: the datastore stays in host memory).")
    if args.out is not None:
        write_json(args.out, {"projection": True, "profile": recorded_path(args.profile),
                              "bench": recorded_path(args.bench),
                              "compare": None if args.compare is None else recorded_path(args.compare),
                              "source_profile": None if args.source_profile is None
                              else recorded_path(args.source_profile), "host_pieces_from_source": borrowed,
                              "bench_target": bench_target, "rows": rows})
    return 0


def _bench_target(bench: Path) -> str | None:
    """The target the bench's methods ran (the first method's run.json), where recorded."""
    try:
        first = json.loads((bench / "bench.json").read_text())[0]["dir"]
        return json.loads((bench / first / "run.json").read_text())["paths"]["target"]
    except (OSError, json.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
