"""Checks of a kernel's PTX that no run can make reliably: registers of a wgmma still in flight.

PTX leaves undefined any access, by another instruction, to the accumulator registers or the
A-fragment registers of a wgmma.mma_async before a wgmma.wait_group covers its group. The
compiler does not know that a wgmma keeps reading its A registers after it is issued: once it
counts them dead it may write other values there (seen in the attention's OVERLAP build: the
next block's P written into the registers a P V wgmma was reading, NaN on the GPU). This walks
the control-flow graph of each entry with the sets of wgmma groups that may be pending and
reports every such access on any path. Paths are not told apart by their conditions, so a
kernel passes when its waits do not depend on branches that merely correlate with its issues."""
import re

_REG = re.compile(r"%[rf]\d+")
_LABEL = re.compile(r"^(\$L\w+):$")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L\w+)")
_WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)")


def _instructions(ptx):
    """(line number, text) of the instructions and labels, comments and directives left out."""
    out = []
    for n, line in enumerate(ptx.splitlines(), 1):
        t = line.strip()
        if not t or t.startswith("//") or t in ("{", "}") or (t.startswith(".") and not t.startswith(".reg")):
            continue
        out.append((n, t))
    return out


def _blocks(ins):
    """Basic blocks [(first, end)] of the instruction list and their successors."""
    labels = {_LABEL.match(t).group(1): i for i, (_, t) in enumerate(ins) if _LABEL.match(t)}
    leaders = {0, *labels.values()}
    for i, (_, t) in enumerate(ins):
        if (_BRANCH.search(t) or re.search(r"\b(ret|exit)\b", t)) and i + 1 < len(ins):
            leaders.add(i + 1)
    leaders = sorted(leaders)
    blocks = [(s, leaders[k + 1] if k + 1 < len(leaders) else len(ins)) for k, s in enumerate(leaders)]
    index = {s: k for k, (s, _) in enumerate(blocks)}
    succ = []
    for k, (_, e) in enumerate(blocks):
        last = ins[e - 1][1]
        nxt = []
        m = _BRANCH.search(last)
        if m:
            nxt.append(index[labels[m.group(1)]])
            if last.startswith("@") and k + 1 < len(blocks):  # predicated: may fall through
                nxt.append(k + 1)
        elif not re.search(r"\b(ret|exit)\b", last) and k + 1 < len(blocks):
            nxt.append(k + 1)
        succ.append(nxt)
    return blocks, succ


def wgmma_register_hazards(ptx):
    """[(line, wgmma line, registers, instruction)]: instructions touching registers of a wgmma
    that may still be in flight there."""
    ins = _instructions(ptx)
    blocks, succ = _blocks(ins)
    wregs = {i: set(_REG.findall(t)) for i, (_, t) in enumerate(ins) if "wgmma.mma_async" in t}
    entry = [set() for _ in blocks]
    entry[0] = {((), ())}  # (committed groups still pending, the open group): wgmma indices
    bad, work = set(), [0]
    while work:
        k = work.pop()
        states = set(entry[k])
        for i in range(*blocks[k]):
            n, t = ins[i]
            nxt = set()
            for groups, cur in states:
                if "wgmma.mma_async" in t:
                    nxt.add((groups, cur + (i,)))
                elif "wgmma.commit_group" in t:
                    nxt.add((groups + (cur,), ()))
                elif _WAIT.search(t):
                    keep = int(_WAIT.search(t).group(1))
                    nxt.add((groups[len(groups) - keep:] if keep else (), cur))
                else:
                    used = set(_REG.findall(t))
                    for g in groups + (cur,):
                        for w in g:
                            hit = used & wregs[w]
                            if hit:
                                bad.add((n, ins[w][0], tuple(sorted(hit)), t))
                    nxt.add((groups, cur))
            states = nxt
        for s in succ[k]:
            if not states <= entry[s]:
                entry[s] |= states
                work.append(s)
    return sorted(bad)
