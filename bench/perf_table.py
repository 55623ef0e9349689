"""Writes the current figures of docs/perf.md and README.md from a `python -m h3kernels bench --json`
file, the one source of both: one table per operator, with the run's date, device and command, each
form's share of its own instruction family's ceiling and the peers timed in the same run; then,
where the run has them, the attention beside the FP8 peers (kernels alone) and the accuracy table
(rel L2 against exact attention), else a line saying they were not run. Only the text between the
two marker lines of each document changes (notebook 03 reads the file itself).

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
# The attention rows' FP8 peer fields (`<key>_ms` of h3kernels.peers.fp8_attention.PEERS) and their
# columns; FP8_KERNELS: those timed as their kernel alone, which the ratios take the faster of
FP8_PEERS = (("fa3_ms", "FA3 bf16"), ("fa3_fp8_ms", "FA3 FP8 kernel"), ("cudnn_fp8_ms", "cuDNN FP8 kernel"))
FP8_KERNELS = ("fa3_fp8_ms", "cudnn_fp8_ms")
NOT_RUN = "FlashAttention-3 in bf16 and FP8, cuDNN's FP8 SDPA"


def run_command(data, given=None):
    if given:
        return given
    if data.get("command", "").startswith("python"):  # `bench --json` writes its own name, "bench", there
        return data["command"]
    found = re.search(r"`(python3? -m h3kernels bench[^`]*)`", data.get("source", ""))
    return found.group(1) if found else "python -m h3kernels bench --json PATH"


def _wrap(text):
    return textwrap.wrap(text, 100, break_long_words=False, break_on_hyphens=False)


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


def fp8_peer_table(rows, family, unavailable):
    """The attention rows beside the FP8 peers they have: ours' whole call and kernel alone, the
    bf16 peer, each peer present, and the faster FP8 kernel's time over ours' kernel and call;
    None where the rows have neither a peer's time nor ours' kernel alone."""
    peers = [(f, label) for f, label in FP8_PEERS if any(f in r for r in rows)]
    if not peers and not any("ours_kernel_ms" in r for r in rows):
        return None
    kernels = [f for f in FP8_KERNELS if any(f in r for r in rows)]
    bf16 = list(dict.fromkeys(r["peer"] for r in rows))
    head = (["case", "form", "ours ms", "ours kernel ms", f"{bf16[0]} ms" if len(bf16) == 1 else "bf16 peer ms"]
            + [f"{label} ms" for _, label in peers]
            + (["ours kernel / best FP8", "ours call / best FP8"] if kernels else []))
    lines = ["**Attention beside the FP8 peers (kernels alone)**", "", "| " + " | ".join(head) + " |",
             "| " + " | ".join("---" if i < 2 else "---:" for i in range(len(head))) + " |"]
    for r in rows:
        cells = [r["case"], f"{r['form']} ({family.get(r['form'], '?')})", f"{r['ours_ms']:.3f}",
                 _num(r.get("ours_kernel_ms"), ".3f"), f"{r['peer_ms']:.3f}"]
        cells += [_num(r.get(f), ".3f") for f, _ in peers]
        if kernels:
            best = min((r[f] for f in kernels if f in r), default=None)
            cells += [f"{best / r[f]:.2f}x" if best is not None and r.get(f) else ""
                      for f in ("ours_kernel_ms", "ours_ms")]
        lines.append("| " + " | ".join(cells) + " |")
    note = ("Kernels alone: ours' attention kernel replayed on the scratch its call left (no quantization "
            "passes); the FP8 peers on operands quantized beforehand (FA3: a scale per segment and head; "
            "cuDNN: one per tensor, sets of equal segment lengths only); FA3 bf16 and the bf16 peer are whole calls.")
    if kernels:
        note += (" \"best FP8\": the faster FP8 peer kernel of the row; \"ours kernel / best FP8\" is its time "
                 "over ours' kernel alone, \"ours call / best FP8\" over ours' whole call (above 1: ours is faster).")
    absent = [label for f, label in FP8_PEERS if f[:-3] in unavailable and (f, label) not in peers]
    partly = [label for f, label in peers if any(f not in r for r in rows)]
    said = ([f"not run: {', '.join(absent)}"] if absent else []) + (
        [f"missing from some measurements: {', '.join(partly)}"] if partly else [])
    if said:
        said = "; ".join(said)
        note += f" {said[0].upper()}{said[1:]} (the reasons: \"peers_unavailable\" in the JSON)."
    return lines + [""] + _wrap(note)


def accuracy_table(acc, unavailable):
    """The accuracy rows of the run (`accuracy`: h3kernels.testing.fp8_accuracy's figures): rel L2
    against exact attention without and with the key offset; None where the run has none."""
    if not acc or "rows" not in acc:
        return None
    measured = {a["key"] for a in acc["rows"] if "key" in a}
    absent = [label for f, label in FP8_PEERS if f in FP8_KERNELS and f[:-3] in unavailable and f[:-3] not in measured]
    intro = (f"**Attention accuracy**, rel L2 against {acc['against']}: one segment of {acc['tokens']} tokens, "
             f"{acc['heads']} heads of {acc['head_dim']}, seeded random bf16 q, k, v (seed {acc['seed']}); "
             f"\"K offset\": K + {acc['k_offset']:g} x a random vector per head, the same for every token, as "
             "real keys have.")
    lines = [*_wrap(intro), "", "| method | rel L2 | rel L2, K offset |", "| --- | ---: | ---: |"]
    for a in acc["rows"]:
        lines.append(f"| {a['label']} | {_num(a.get('rel_l2'), '.4f')} | {_num(a.get('rel_l2_k_offset'), '.4f')} |")
    if absent:
        lines += ["", *_wrap(f"Not measured: {', '.join(absent)} (the reasons: \"peers_unavailable\" in the JSON).")]
    return lines


def fp8_part(data, family):
    """The FP8 peers' table and the accuracy table where the run has them; a line for what it lacks."""
    rows = [r for r in data["rows"] if r["op"] == "attention"]
    peers = fp8_peer_table(rows, family, data.get("peers_unavailable", {})) if rows else None
    acc = accuracy_table(data.get("accuracy"), data.get("peers_unavailable", {}))
    if not rows and acc is None:
        return []
    failed = " (the run's measurement failed: \"accuracy\" in the JSON)" if "error" in data.get("accuracy", {}) else ""
    if peers is None and acc is None:
        return _wrap(f"FP8 attention peers ({NOT_RUN}) and the accuracy beside them: not run for these "
                     f"figures{failed}.") + [""]
    lines = []
    if peers is not None:
        lines += peers + [""]
    elif rows:
        lines += _wrap(f"FP8 attention peers ({NOT_RUN}): not run for these figures.") + [""]
    if acc is not None:
        lines += acc + [""]
    else:
        lines += _wrap(f"Accuracy against exact attention: not measured for these figures{failed}.") + [""]
    return lines


def tables(data, command=None):
    """The generated block: the run's line, one table per operator present in the file, then the
    FP8 attention peers and the accuracy (fp8_part)."""
    ceilings = ", ".join(f"{c['family']} (form {c['form']}) {c['tflops']:.0f}" for c in data.get("ceilings", [])
                         if c.get("tflops"))
    run = (f"{data['date']}, one {data['device']}: `{run_command(data, command)}`. e4m3 ceilings measured in "
           f"the same run: {ceilings} TFLOP/s. Times are CUDA-event medians of back-to-back calls of the whole "
           "operator; \"ours / peer\" is the peer's time over ours (above 1: ours is faster).")
    lines = [*_wrap(run), ""]
    family = {c["form"]: c["family"] for c in data.get("ceilings", [])}  # as the bench named them
    for op, label in OPERATORS:
        rows = [r for r in data["rows"] if r["op"] == op]
        if rows:
            lines += operator_table(rows, label, family) + [""]
    lines += fp8_part(data, family)
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
