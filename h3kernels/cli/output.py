"""Where the commands write their results (--json, bench's --csv): the paths checked before any
work, and the JSON document every command writes, also when it exits 1 or 3."""
import json
import os
from pathlib import Path

from h3kernels.cli.status import FAILED, MISSING, OK, WORD, UsageError

PATH_OPTIONS = ("json", "csv")  # the options, on any command, that name a file to write


def check_writable(option, path):
    """UsageError unless `path` can be written as a file, found without creating or truncating
    anything: a missing or non-directory parent, a directory, or no write permission would
    otherwise fail only after the command's work."""
    if path is None:
        return
    target = Path(path)
    where = f"{option} {path!r} cannot be written"
    if not str(path):
        raise UsageError(f"{option} needs a file path, such as results.json; got an empty one")
    if target.is_dir() or str(path).endswith(("/", os.sep)):
        raise UsageError(f"{where}: it names a directory; give a file path, such as results.json")
    parent = target.parent
    if not parent.exists():
        raise UsageError(f"{where}: its directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{where}: {str(parent)!r} is not a directory")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{where}: no permission to write that file")
    if not target.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: no permission to create a file in {str(parent)!r}")


def write_json(path, doc):
    if path:
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def finish(path, doc, ok=True):
    """Writes a command's results to its --json path (when given) with the verdict: "ok", and
    "status" and "exit" as its exit status; returns that status."""
    status = OK if ok else FAILED
    write_json(path, {**doc, "ok": bool(ok), "status": WORD[status], "exit": status})
    return status


def finish_missing(path, command, reason):
    """The --json document of a command that exits 3: what it lacks, in the same keys as
    finish() writes (the command's results are absent: it did not run)."""
    write_json(path, dict(command=command, ok=False, status=WORD[MISSING], exit=MISSING, reason=reason))
    return MISSING
