"""What a run is: `run.json` in its folder records the benchmark settings, the method config and
the fingerprints of the target, drafter and datastore it used. A resume with anything different
is refused with the difference named, so one summary never mixes two models or two settings.

Paths are recorded for the reader but not compared: a checkpoint moved elsewhere is the same
checkpoint. A datastore counts as the same when its data and calibration are; the online skip
thresholds in its manifest may move (`--persist-thresholds` by another run) without changing it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from heisd.errors import OutputError
from heisd.storage import OutputKind, recorded_path, write_json
from heisd.storage.guard import json_with

RUN_FILE = "run.json"
EVAL_RUN = OutputKind("evaluation run", json_with(RUN_FILE, "benchmark"))
PATHS_KEY = "paths"  # where the resources were; informative, not compared


def _sha256_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def datastore_identity(root: Path) -> dict[str, str]:
    """The datastore's data (its file records) and its calibration (the extras without online thetas)."""
    from heisd.retrieval.manifest import files_fingerprint, read_manifest
    from heisd.retrieval.online import calibration_of

    manifest = read_manifest(Path(root))
    extras = {k: calibration_of(v) if isinstance(v, dict) else v for k, v in manifest["extras"].items()}
    return {"fingerprint": files_fingerprint(manifest),
            "calibration": hashlib.sha256(json.dumps(extras, sort_keys=True).encode()).hexdigest()}


def run_identity(target_fingerprint: str, mc, target_path: str | None = None) -> dict[str, Any]:
    """run.json's record of the resources and the method configuration `mc` (a MethodConfig)."""
    from heisd.drafter.model import CONFIG_FILE, WEIGHTS_FILE

    method = {k: v for k, v in asdict(mc).items() if k not in ("drafter", "datastore")}
    identity: dict[str, Any] = {"target": {"fingerprint": target_fingerprint}, "method_config": method}
    if mc.drafter:
        identity["drafter"] = {"fingerprint": _sha256_files([Path(mc.drafter, n) for n in (CONFIG_FILE, WEIGHTS_FILE)])}
    if mc.datastore:
        identity["datastore"] = datastore_identity(Path(mc.datastore))
    paths = {"target": target_path, "drafter": mc.drafter, "datastore": mc.datastore}
    identity[PATHS_KEY] = {name: None if path is None else recorded_path(path) for name, path in paths.items()}
    return identity


def server_identity(info: dict, url: str) -> dict[str, Any]:
    """run.json's record of a `heisd serve` policy, from the server's /info."""
    method = {k: v for k, v in info["method_config"].items() if k not in ("drafter", "datastore")}
    return {"target": {"fingerprint": info["target"]["fingerprint"]}, "method_config": method,
            PATHS_KEY: {"server": url, "target": info["target"]["path"]}}


def _flatten(record: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(old: dict, new: dict) -> list[str]:
    """'key: before -> now' for every compared field that differs."""
    a = _flatten({k: v for k, v in old.items() if k != PATHS_KEY})
    b = _flatten({k: v for k, v in new.items() if k != PATHS_KEY})
    missing = "(none)"

    def show(value: Any) -> str:
        text = str(value)
        return text[:12] + "..." if len(text) > 24 else text  # fingerprints: a prefix tells them apart

    return [f"{key}: {show(a.get(key, missing))} -> {show(b.get(key, missing))}" for key in sorted(set(a) | set(b))
            if a.get(key, missing) != b.get(key, missing)]


def check_run(out: Path, record: dict, as_ran: Callable[[dict], dict] = lambda saved: saved) -> None:
    """Write `out/run.json`, or refuse to continue a run recorded with anything else (`as_ran`: the saved
    record as its episodes ran, for records an older heisd wrote)."""
    record = json.loads(json.dumps(record))  # tuples -> lists, as read back
    path = Path(out) / RUN_FILE
    if not path.exists():
        write_json(path, record)
        return
    diff = differences(as_ran(json.loads(path.read_text())), record)
    if diff:
        shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise OutputError(f"{out} holds a run with other settings ({shown}); resume it with the same "
                          "settings or use another --out")
