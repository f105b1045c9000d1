"""The `heisd` command line (started by `heisd.cli`): one subcommand per module in `heisd.commands`.

Each command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`;
`LOCKS_OUT = True` makes the command hold the lock of its `--out` path while it runs, so a second
process writing the same output is refused at once instead of silently losing one run's work.
Modules are imported only when their subcommand runs, so `heisd --help` stays fast and
optional heavy dependencies load lazily.

Errors: a `HeisdError` (bad flag, input or output) or an `OSError` (disk full, permission
denied) prints one line and exits 1 (2 for usage errors, as argparse does); a write the system
refuses is a `WriteError` naming the output (`heisd.storage.failures`). Anything else is a bug
and keeps its traceback. `--debug` or HEISD_DEBUG=1 prints the traceback of every error.
Ctrl-C and SIGTERM stop cleanly (temporaries removed, locks released), exit 130 / 143.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import traceback
from contextlib import nullcontext

DEBUG_HELP = "print the full traceback of an error (also: HEISD_DEBUG=1)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, not the whole usage block; exit 2 as argparse does."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# subcommand name -> module under heisd.commands (the pipeline of docs/design.md §3.2)
COMMANDS = {
    "demos": "demos",
    "train-vla": "train_vla",
    "dagger": "dagger",
    "train-drafter": "train_drafter",
    "build-datastore": "build_datastore",
    "reindex": "reindex",
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
    "robot": "robot",
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
    parser = _Parser(
        prog="heisd",
        description="Hybrid speculative decoding for vision-language-action models.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
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
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser, available


def main(argv: list[str] | None = None) -> int:
    from heisd.commands.common import shipped_target
    from heisd.errors import HeisdError
    from heisd.flags import check_args
    from heisd.storage import output_lock, raise_on_sigterm

    argv = sys.argv[1:] if argv is None else argv
    _show_heisd_log()
    command = next((a for a in argv if not a.startswith("-")), None)
    parser, available = build_parser(command)
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("HEISD_DEBUG", "") not in ("", "0")
    prog = f"heisd {args.command}"
    try:
        with raise_on_sigterm():
            check_args(_subparser(parser, args.command), args)
            shipped_target(args)
            mod = importlib.import_module(f"heisd.commands.{available[args.command]}")
            out = getattr(args, "out", None) if getattr(mod, "LOCKS_OUT", False) else None
            with output_lock(out) if out is not None else nullcontext():
                return mod.run(args)
    except KeyboardInterrupt as err:
        code = 128 + getattr(err, "signum", 2)  # SIGINT 2 (KeyboardInterrupt) or SIGTERM 15
        print(f"{prog}: interrupted; finished outputs are kept, unfinished ones removed", file=sys.stderr)
        return code
    except (HeisdError, OSError) as err:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return getattr(err, "exit_code", 1)


def _show_heisd_log() -> None:
    """heisd's library modules log (progress notes, warnings); the command line shows them on
    stderr. Only heisd's: other packages' INFO chatter (PyOpenGL, ...) stays quiet."""
    log = logging.getLogger("heisd")
    log.setLevel(logging.INFO)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)


class _StderrHandler(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a record comes (a caller may have replaced it since)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass  # StreamHandler's constructor sets it; the property always answers the current stderr


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror and err.filename:
        return f"{err.filename}: {err.strerror}"
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
