"""The scale benchmark's markdown: one table per size, then how each command grows with the chunk count.

Per size: the chunk count, the two ``.metadata`` files' size, the generator's own cost, torch's
read (the reference) and each tool in each state, with its CPU time as a multiple of torch's.
The growth table compares consecutive sizes of one model and layout: the ratio of a command's
CPU time against the ratio of chunks, and the log-log slope between them (1: linear in the
chunk count; the interpreter's fixed start-up pulls small sizes below it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from devtools.scale.bench import SizeResult
from devtools.scale.measure import Measured
from devtools.scale.shapes import MODELS

TORCH = ("torch", "-")


def size_table(r: SizeResult) -> str:
    shape = MODELS[r.size.model]
    title = f"### {shape.name}, {r.world.label() if r.world else r.size.layout} ({r.size.ranks} ranks)"
    if r.skipped:
        return f"{title}\n\nskipped: {r.skipped}\n"
    gen = r.generator
    made = "timed when generated, reused here" if r.reused else "fresh process"
    lines = [
        title,
        "",
        f"{r.chunks:,} chunks, .metadata {r.metadata_bytes / 2**20:.1f} MiB (both DCP dirs), {r.files:,} shard files",
        "",
        "| command | state | CPU s | wall s | peak MiB | CPU × torch read |",
        "|---|---|---:|---:|---:|---:|",
    ]
    if gen is not None:
        lines.append(f"| generator ({made}) | | {_cells(gen, None)} |")
    if r.torch is not None:
        lines.append(f"| torch read_metadata (both DCP dirs) | | {_cells(r.torch, r.torch)} |")
    unavailable = {}  # state -> why, when no tool could be measured in it
    for state in dict.fromkeys(state for _, state in r.tools):
        values = {v for (_, s), v in r.tools.items() if s == state}
        if all(isinstance(v, str) for v in values) and len(values) == 1:
            unavailable[state] = values.pop()
    for (key, state), value in r.tools.items():
        if state not in unavailable:
            cells = value if isinstance(value, str) else _cells(value, r.torch)
            lines.append(f"| {r.labels.get(key, key)} | {state} | {cells} |")
    lines += [f"| every tool | {state} | {why} | | | |" for state, why in unavailable.items()]
    return "\n".join(lines) + "\n"


def _cells(m: Measured, reference: Measured | None) -> str:
    if m.timed_out:
        return "timeout | | |"
    ratio = f"{m.cpu / reference.cpu:.2f}" if reference is not None and reference.cpu > 0 else ""
    failed = f" (exit {m.code})" if m.code else ""
    return f"{m.cpu:.2f}{failed} | {m.wall:.2f} | {m.peak_mib:.0f} | {ratio}"


def floors_line(measured: list[tuple[str, Measured]]) -> str:
    """One line: what starting each kind of process costs (part of every number in the tables)."""
    parts = [f"`{label}` {m.cpu:.2f} CPU s ({m.peak_mib:.0f} MiB)" for label, m in measured]
    return "Start-up floors (every measured process pays one): " + ", ".join(parts) + "\n"


def growth_table(results: Iterable[SizeResult]) -> str:
    series: dict[tuple[str, str], list[SizeResult]] = {}
    for r in results:
        if not r.skipped:
            series.setdefault((r.size.model, r.size.layout), []).append(r)
    lines = [
        "### Growth: CPU time against chunk count",
        "",
        "| command | state | series | ranks | chunks × | CPU × | log-log slope |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for (model, layout), sizes in series.items():
        sizes.sort(key=lambda r: r.size.ranks)
        for before, after in itertools.pairwise(sizes):
            keys = [TORCH, *(k for k in after.tools if k in before.tools)]
            for key in keys:
                a, b = _measured(before, key), _measured(after, key)
                if a is None or b is None or a.timed_out or b.timed_out or a.cpu <= 0:
                    continue
                label = "torch read_metadata" if key == TORCH else after.labels.get(key[0], key[0])
                chunks, cpu = after.chunks / before.chunks, b.cpu / a.cpu
                slope = math.log(cpu) / math.log(chunks) if chunks > 1 else float("nan")
                lines.append(
                    f"| {label} | {key[1]} | {model} {layout} | {before.size.ranks} → {after.size.ranks}"
                    f" | {chunks:.1f} | {cpu:.1f} | {slope:.2f} |"
                )
    return "\n".join(lines) + "\n"


def _measured(r: SizeResult, key: tuple[str, str]) -> Measured | None:
    value = r.torch if key == TORCH else r.tools.get(key)
    return value if isinstance(value, Measured) else None
