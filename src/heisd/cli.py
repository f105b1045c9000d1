"""`heisd` command line: one subcommand per module in `heisd.commands`.

Each command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Modules are imported only when their subcommand runs, so `heisd --help` stays fast and
optional heavy dependencies load lazily.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# subcommand name -> module under heisd.commands (names fixed by DESIGN.md section 5)
COMMANDS = {
    "demos": "demos",
    "train-vla": "train_vla",
    "train-drafter": "train_drafter",
    "build-datastore": "build_datastore",
    "calibrate": "calibrate",
    "replay": "replay",
    "eval": "eval",
    "bench": "bench",
    "demo": "demo",
    "tiny-openvla": "tiny_openvla",
    "profile": "profile",
    "project": "project",
    "serve": "serve",
    "loadtest": "loadtest",
}


def _available() -> dict[str, str]:
    """Only commands whose module exists are offered; unimplemented ones are absent, not faked."""
    found = {}
    for name, module in COMMANDS.items():
        if importlib.util.find_spec(f"heisd.commands.{module}") is not None:
            found[name] = module
    return found


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The parser with the flags of `command` only (building a command's flags may import
    torch), so `heisd --help` stays fast."""
    parser = argparse.ArgumentParser(
        prog="heisd",
        description="Hybrid speculative decoding for vision-language-action models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    available = _available()
    for name, module in available.items():
        mod = importlib.import_module(f"heisd.commands.{module}")
        p = sub.add_parser(
            name, help=mod.HELP, description=mod.HELP,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        if name == command:
            mod.add_arguments(p)
    return parser, available


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser, available = build_parser(command)
    args = parser.parse_args(argv)
    mod = importlib.import_module(f"heisd.commands.{available[args.command]}")
    try:
        return mod.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
