"""How heisd writes: atomic files and directories, guarded outputs, directory locks, interrupts
that clean up after themselves, refused writes (a full disk) as one error naming the output, and
paths as records keep them. Every command writes through this package."""

from heisd.storage.atomic import (append_text, atomic_directory, atomic_file, atomic_files, fsync_path, strict_json,
                                  write_json, write_text)
from heisd.storage.guard import OutputKind, check_output, clear_output, is_free, refuse_foreign
from heisd.storage.interrupts import raise_on_sigterm
from heisd.storage.lock import LOCK_FILE, directory_lock, output_lock
from heisd.storage.paths import recorded_command, recorded_path

__all__ = ["LOCK_FILE", "OutputKind", "append_text", "atomic_directory", "atomic_file", "atomic_files",
           "check_output", "clear_output", "directory_lock", "fsync_path", "is_free", "output_lock",
           "raise_on_sigterm", "recorded_command", "recorded_path", "refuse_foreign", "strict_json", "write_json",
           "write_text"]
