"""The command line's exit statuses, the same for every command (and examples/h3_block.py), and
the two errors that end a command early with one line on stderr."""

OK = 0  # success
FAILED = 1  # a check failed: a result outside its bound, a compile error, a spill
# bad usage: an unknown command, option or name, malformed sizes, sizes too large for the CPU,
# an --arch a named source is not built for, an output path that cannot be written
USAGE = 2
MISSING = 3  # this machine lacks what the command needs: a CUDA GPU, or a matching nvdisasm

# The word each status has as "status" in the --json document. Bad usage writes no document:
# it is refused before any work, and its output path may be what was wrong.
WORD = {OK: "ok", FAILED: "failed", MISSING: "missing"}


class UsageError(ValueError):
    """A command line that cannot run as given: one line on stderr, exit 2."""


class MissingNeed(RuntimeError):
    """This machine lacks what the command needs: one line on stderr, exit 3."""
