"""Writes the current figures of docs/perf.md and README.md from a `python -m h3kernels bench --json`
file, the one source of both: one table per operator, with the run's date, device and command, each
form's share of its own instruction family's ceiling and the peers timed in the same run. Only the
text between the two marker lines of each document changes (notebook 03 reads the file itself).

python bench/perf_table.py [JSON] [--doc DOC ...] [--command CMD] [--check]

JSON defaults to docs/perf_h200.json, the documents to docs/perf.md and README.md. The command shown is --command, else the file's "command" key,
else the first `python... -m h3kernels bench ...` span quoted in its "source". --check writes nothing
and exits 1 when a document's tables differ from those the file gives.
"""
import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- perf_table: begin (written by bench/perf_table.py; edit the JSON, not this) -->"
END = "<!-- perf_table: end -->"
OPERATORS = (("mlp", "MLP (`minimax_h3_mlp_fp8`)"), ("attention", "Attention (`minimax_h3_varlen_attention_fp8`)"))


def run_command(data, given=None):
    if given:
        return given
    if data.get("command", "").startswith("python"):  # `bench --json` writes its own name, "bench", there
        return data["command"]
    found = re.search(r"`(python3? -m h3kernels bench[^`]*)`", data.get("source", ""))
    return found.group(1) if found else "python -m h3kernels bench --json PATH"


def _num(x, fmt):
    return "" if x is None else format(x, fmt)


def operator_table(rows, label, family):
    """A markdown table of one operator's rows (in the file's order), peers included; family:
    {form: its instruction family}."""
    second = any("peer2" in r for r in rows)
    head = ["case", "form", "ours ms", "TFLOP/s", "% of its family's ceiling", "peer", "peer ms", "ours / peer"]
    if second:
        head += ["second peer", "ms", "ours / second"]
    lines = [f"**{label}**", "", "| " + " | ".join(head) + " |",
             "| " + " | ".join("---" if i in (0, 1, 5, 8) else "---:" for i in range(len(head))) + " |"]
    for r in rows:
        form = f"{r['form']} ({family.get(r['form'], '?')})"
        cells = [r["case"], form, f"{r['ours_ms']:.3f}", _num(r.get("ours_tflops"), ".0f"),
                 _num(r.get("pct_ceiling"), ".1f") + ("%" if r.get("pct_ceiling") is not None else ""),
                 r["peer"], f"{r['peer_ms']:.3f}", f"{r['peer_ms'] / r['ours_ms']:.2f}x"]
        if second:
            cells += ([r["peer2"], f"{r['peer2_ms']:.3f}", f"{r['peer2_ms'] / r['ours_ms']:.2f}x"] if "peer2" in r
                      else ["", "", ""])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def tables(data, command=None):
    """The generated block: the run's line, then one table per operator present in the file."""
    ceilings = ", ".join(f"{c['family']} (form {c['form']}) {c['tflops']:.0f}" for c in data.get("ceilings", [])
                         if c.get("tflops"))
    run = (f"{data['date']}, one {data['device']}: `{run_command(data, command)}`. e4m3 ceilings measured in "
           f"the same run: {ceilings} TFLOP/s. Times are CUDA-event medians of back-to-back calls of the whole "
           "operator; \"ours / peer\" is the peer's time over ours (above 1: ours is faster).")
    lines = [*textwrap.wrap(run, 100, break_long_words=False, break_on_hyphens=False), ""]
    family = {c["form"]: c["family"] for c in data.get("ceilings", [])}  # as the bench named them
    for op, label in OPERATORS:
        rows = [r for r in data["rows"] if r["op"] == op]
        if rows:
            lines += operator_table(rows, label, family) + [""]
    return "\n".join(lines).rstrip() + "\n"


def rewrite(doc, block):
    """doc with the text between the marker lines replaced by block."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the document lacks the marker lines {BEGIN!r} ... {END!r}")
    return doc[:start + len(BEGIN)] + "\n" + block + doc[end:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="?", default=str(ROOT / "docs" / "perf_h200.json"))
    p.add_argument("--doc", action="append", help="a document to write (repeatable; default docs/perf.md and README.md)")
    p.add_argument("--command", help="the command that wrote the JSON (shown above the tables)")
    p.add_argument("--check", action="store_true", help="exit 1 if the document is not current; write nothing")
    a = p.parse_args(argv)
    data = json.loads(Path(a.json).read_text())
    block, stale = tables(data, a.command), []
    for doc_path in map(Path, a.doc or (ROOT / "docs" / "perf.md", ROOT / "README.md")):
        doc = doc_path.read_text()
        new = rewrite(doc, block)
        if a.check:
            if new != doc:
                stale.append(doc_path)
                print(f"{doc_path}: the tables differ from those of {a.json} (run bench/perf_table.py)",
                      file=sys.stderr)
        else:
            doc_path.write_text(new)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
