"""Reads the output of `pip install` and names every distribution that pip downloaded at more than
one version: a release it fetched (or took from its cache, which a new machine lacks) only to drop it
for another once more requirements were known. pip prints no backtracking message for this, yet
each such release costs a download, up to a whole torch wheel. Wheels pip reads from a local
directory ("Processing /path/x.whl") cost none and are not counted.

Usage: python pip_refetches.py LOG...; exits 1, listing them, when there is any."""
import re
import sys
from collections import defaultdict

# "  Downloading cuda_bindings-13.5.0-cp311-....whl (8.4 MB)", "  Using cached x-1.0.tar.gz (12 kB)";
# older pips print the URL, and "x.whl.metadata" is the metadata of that same file.
_FETCH = re.compile(r"^\s*(?:Downloading|Using cached)\s+(\S+?\.(?:whl|tar\.gz|zip))(?:\.metadata)?\b")


def distribution(file_name):
    """(normalized name, version) of a wheel or sdist file name, or None."""
    base = file_name.rsplit("/", 1)[-1]
    if base.endswith(".whl"):
        parts = base[:-4].split("-")
        if len(parts) < 5:
            return None
        name, version = parts[0], parts[1]
    else:
        stem = re.sub(r"\.(tar\.gz|zip)$", "", base)
        name, sep, version = stem.rpartition("-")
        if not sep:
            return None
    return re.sub(r"[-_.]+", "-", name).lower(), version


def refetches(lines):
    """{name: [versions in the order downloaded]} for each distribution downloaded at two or more versions."""
    seen = defaultdict(list)
    for line in lines:
        m = _FETCH.match(line)
        dist = m and distribution(m.group(1))
        if dist and dist[1] not in seen[dist[0]]:
            seen[dist[0]].append(dist[1])
    return {name: versions for name, versions in seen.items() if len(versions) > 1}


def main(paths):
    found = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for name, versions in refetches(f).items():
                found[f"{path}: {name}"] = versions
    for where, versions in found.items():
        print(f"{where}: downloaded {', '.join(versions)}, to install one of them")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
