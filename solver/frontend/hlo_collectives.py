"""XLA's collectives in compiled HLO text, counted as shardplan counts its
own (`tools/xla_plan_check.py`, `plan_jax`'s users): per kind, the ops, the
tensors they move and the bytes of those operands on one device.

XLA's CPU pipeline has no reduce-scatter: it all-reduces and each device
then takes its shard with a dynamic-slice (GPU and TPU pipelines fuse the
two into a reduce-scatter). An all-reduced tensor read only by dynamic
slices (directly, through a tuple's get-tuple-element, or as a fusion's
parameter, through bitcasts, reshapes, copies and transposes) is counted
as the reduce_scatter it stands for; its bytes are its operand's, as a
reduce-scatter's are.
"""

from __future__ import annotations

import re

# HLO collective op names -> ours.
XLA_KINDS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
             "all-to-all": "all_to_all", "collective-permute": "collective_permute"}
HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8}


def xla_collectives(hlo: str) -> dict[str, dict[str, int]]:
    """Per collective kind in compiled HLO text, as executed once: the ops,
    the tensors they move (XLA combines several all-reduces into one op of
    a tuple, so tensors is the figure to compare with shardplan's op count;
    an all-to-all of one operand per peer is one tensor cut in pieces)
    and the bytes of those operands on one device. A collective inside a
    while loop's body counts once per trip (XLA keeps a scanned layer
    stack as a loop; its `known_trip_count` says how many). An all-reduced
    tensor only sliced counts as a reduce_scatter (the module docstring)."""
    shapes = {m.group(1): _hlo_bytes(m.group(2)) for m in re.finditer(r"%([\w.\-]+) = ([a-z]+\d*\[[\d,]*\])", hlo)}
    computations = _computations(hlo)
    trips = _trips(computations)
    out: dict[str, dict[str, int]] = {}

    def add(kind: str, ops: int, tensors: int, moved: int, trips: int) -> None:
        entry = out.setdefault(kind, {"ops": 0, "tensors": 0, "bytes": 0})
        entry["ops"] += ops * trips
        entry["tensors"] += tensors * trips
        entry["bytes"] += moved * trips

    for name, lines in computations.items():
        sliced = _sliced_only(name, computations)
        for line in lines:
            m = re.search(r"%([\w.\-]+) = (.*?) ([a-z\-]+?)(?:-start)?\(([^)]*)\)", line)
            if m is None or m.group(3) not in XLA_KINDS:
                continue
            operands = re.findall(r"%([\w.\-]+)", m.group(4))
            kind = XLA_KINDS[m.group(3)]
            if kind != "all_reduce":
                # An all-to-all of several operands and no split dimension is one tensor cut into one piece
                # per peer (XLA's CPU pipeline writes them so), not several tensors.
                pieces = kind == "all_to_all" and "dimensions=" not in line
                add(kind, 1, 1 if pieces else len(operands), sum(shapes.get(o, 0) for o in operands), trips[name])
                continue
            # An all-reduce's operands are shaped like its result (element by element for a tuple).
            elements = _tuple_types(m.group(2))
            scattered = [i for i in range(len(elements)) if (m.group(1), i if len(elements) > 1 else None) in sliced]
            kept = [i for i in range(len(elements)) if i not in scattered]
            # The op counts as a reduce_scatter where all its tensors are; a tuple of both kinds is an all-reduce op.
            for part, as_kind in ((scattered, "reduce_scatter"), (kept, "all_reduce")):
                if part:
                    add(as_kind, 1 if len(part) == len(elements) or as_kind == "all_reduce" else 0, len(part),
                        sum(_hlo_bytes(elements[i]) for i in part), trips[name])
    return out


_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*?)\)(.*)$")
_PASS_THROUGH = frozenset({"bitcast", "reshape", "copy", "transpose"})


def _instructions(lines: list[str]) -> dict[str, tuple[str, list[str], str]]:
    """name -> (opcode, operand names, the rest of the line) of one computation."""
    out = {}
    for line in lines:
        m = _INSTRUCTION.match(line)
        if m:
            out[m.group(1)] = (m.group(3), re.findall(r"%([\w.\-]+)", m.group(4)), m.group(5) + line)
    return out


def _only_sliced(value: str, body: dict, computations: dict, depth: int = 0) -> bool:
    """Every read of `value` in `body` is a dynamic-slice of it (through pass-through ops and fusions)."""
    readers = [(n, op, args, rest) for n, (op, args, rest) in body.items() if value in args]
    if not readers or depth > 8:
        return False
    for n, op, args, rest in readers:
        if op == "dynamic-slice" and args[0] == value:
            continue
        if op in _PASS_THROUGH and _only_sliced(n, body, computations, depth + 1):
            continue
        called = re.search(r"calls=%([\w.\-]+)", rest)
        if op == "fusion" and called and called.group(1) in computations:
            fused = _instructions(computations[called.group(1)])
            params = [p for i, a in enumerate(args) if a == value
                      for p, (pop, _, prest) in fused.items() if pop == "parameter" and f"parameter({i})" in prest]
            if params and all(_only_sliced(p, fused, computations, depth + 1) for p in params):
                continue
        return False
    return True


def _sliced_only(name: str, computations: dict[str, list[str]]) -> set[tuple[str, int | None]]:
    """The all-reduces of computation `name` (and tuple elements: (op, index)) whose results are only sliced."""
    body = _instructions(computations[name])
    out = set()
    for n, (op, _, _) in body.items():
        if op != "all-reduce":
            continue
        elements = [(g, int(i.group(1))) for g, (gop, gargs, grest) in body.items()
                    if gop == "get-tuple-element" and gargs == [n] and (i := re.search(r"index=(\d+)", grest))]
        if elements:
            out.update((n, i) for g, i in elements if _only_sliced(g, body, computations))
        elif _only_sliced(n, body, computations):
            out.add((n, None))
    return out


def _tuple_types(types: str) -> list[str]:
    """The arrays of an HLO type: one, or each element of a tuple."""
    return re.findall(r"\b[a-z]+\d*\[[\d,]*\](?:\{[\d,]*\})?", types) or [types]


def _computations(hlo: str) -> dict[str, list[str]]:
    """Computation name -> its instruction lines; the entry's name is `ENTRY`."""
    out: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        header = re.match(r"(ENTRY )?%([\w.\-]+) .*\{\s*$", line)  # unindented: instructions are indented
        if header:
            current = "ENTRY" if header.group(1) else header.group(2)
            out[current] = []
        elif line.startswith("}"):
            current = None
        elif current is not None:
            out[current].append(line)
    return out


def _trips(computations: dict[str, list[str]]) -> dict[str, int]:
    """How many times each computation runs per step: a while body runs its
    loop's known trip count times each time its caller runs."""
    trips = dict.fromkeys(computations, 1)
    calls = [(name, m.group(1), int(n.group(1)) if n else 1) for name, lines in computations.items() for line in lines
             if (m := re.search(r" while\(.*body=%([\w.\-]+)", line))
             and ((n := re.search(r'known_trip_count":\{"n":"(\d+)"', line)) or True)]
    for _ in range(len(calls)):  # nested loops: a fixed point in at most as many passes
        for caller, body, n in calls:
            trips[body] = trips.get(caller, 1) * n
    return trips


def _hlo_bytes(types: str) -> int:
    """Bytes of the arrays in an HLO type (`f32[4,8]{1,0}` or a tuple of them)."""
    total = 0
    for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", types):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * HLO_BYTES.get(dtype, 4)
    return total


