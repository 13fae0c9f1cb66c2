"""The scale benchmark, one size at a time: generate (or reuse) a checkpoint, then time everything on it.

A size is a model, a layout and a world size. Before anything is written the machine must be
able to hold it - the sparse shard files on disk, and in memory the metadata objects the
generator builds (and that torch's reader unpickles): sizes it cannot hold are skipped with the
reason. The generator itself is timed too (a fresh process, like every command), so a rerun's
cost is known; with a work directory checkpoints are kept and reused, else each is deleted once
measured. The benchmark's own process never imports torch: a child's peak memory, as the kernel
reports it, starts from its parent's (:mod:`devtools.scale.measure`). Every command runs ``repeat`` times (the median is reported) in each selected state of
:mod:`devtools.scale.states`; progress goes to stderr as it happens.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckpt_tools.format import layout
from devtools.scale import states as st
from devtools.scale.commands import TOOLS, Command, floors, tool_commands, torch_read
from devtools.scale.measure import Measured, Sample, run_once
from devtools.scale.shapes import MODELS, LlamaShape
from devtools.scale.sizes import DISK_MARGIN, chunk_count, disk_needed
from devtools.scale.world import World

BASE_MEMORY = 400 * 2**20  # an interpreter with torch imported
MEMORY_PER_CHUNK = 2 * 1024  # one chunk's unpickled metadata objects (measured: ~1.9 KiB)
MARKER = "GENERATED.json"


@dataclass(frozen=True)
class Size:
    model: str
    layout: str
    ranks: int

    @property
    def label(self) -> str:
        return f"{self.model}-{self.layout}-{self.ranks}"


@dataclass(frozen=True)
class Options:
    repeat: int = 1
    timeout: float = 600.0
    tools: tuple[str, ...] = ()
    states: tuple[str, ...] = ("foreign",)
    threads: int = 4
    hsdp_shard: int = 8
    tools_from: Path | None = None  # run ckpt-tools from this checkout (another commit: the "before")
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)


@dataclass
class SizeResult:
    size: Size
    world: World | None = None
    skipped: str | None = None
    chunks: int = 0
    metadata_bytes: int = 0
    files: int = 0
    generator: Measured | None = None
    reused: bool = False
    torch: Measured | None = None
    # (tool key, state) -> the measurement, or the reason it could not be made ("n/a: ...")
    tools: dict[tuple[str, str], Measured | str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # tool key -> its label


def obstacle(shape: LlamaShape, world: World, run_dir: Path) -> str | None:
    """Why this machine cannot hold the size, or None."""
    chunks, disk = chunk_count(shape, world), disk_needed(shape, world)
    if not (run_dir / MARKER).exists():
        free = shutil.disk_usage(_existing(run_dir)).free
        if disk + DISK_MARGIN > free:
            return f"disk: {free / 2**30:.0f} GiB free, the sparse shard files need ~{disk / 2**30:.0f} GiB"
    needed = BASE_MEMORY + MEMORY_PER_CHUNK * chunks
    available = _available_memory()
    if available is not None and needed > 0.8 * available:
        return (
            f"memory: reading {chunks:,} chunks of metadata needs ~{needed / 2**30:.1f} GiB,"
            f" {available / 2**30:.1f} GiB available"
        )
    return None


def measure_size(size: Size, root: Path, options: Options, keep: bool) -> SizeResult:
    result = SizeResult(size)
    log = options.log
    try:
        world = result.world = World.of(size.layout, size.ranks, options.hsdp_shard)
    except ValueError as e:
        result.skipped = str(e)
        return result
    shape = MODELS[size.model]
    result.chunks = chunk_count(shape, world)
    run_dir = root / size.label
    result.skipped = obstacle(shape, world, run_dir)
    if result.skipped:
        log(f"[{size.label}] skipped: {result.skipped}")
        return result
    try:
        _generated(result, run_dir, options)
        if result.skipped:
            return result
        step = (run_dir / layout.CHECKPOINTS_DIR / layout.LAST_LINK).resolve()
        result.metadata_bytes = sum((d / layout.DCP_METADATA).stat().st_size for d in st.dcp_dirs(step))
        result.files = sum(
            1 for d in st.dcp_dirs(step) for p in d.iterdir() if p.name.endswith(layout.DCP_SHARD_SUFFIX)
        )
        result.torch = _repeat(torch_read(step), options, size.label, None)
        _tools(result, run_dir, step, root, options)
    finally:
        shutil.rmtree(root / f"{size.label}.cache", ignore_errors=True)
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(root / f"{size.label}.indexed", ignore_errors=True)
    return result


def _generated(result: SizeResult, run_dir: Path, options: Options) -> None:
    """Generate the size in a fresh process (timed), or reuse the one a marker says is complete."""
    marker = run_dir / MARKER
    wanted = {"index": False, "model": result.size.model, "layout": result.size.layout, "ranks": result.size.ranks,
              "threads": options.threads, "hsdp_shard": options.hsdp_shard}  # fmt: skip
    if marker.exists():
        saved = json.loads(marker.read_text())
        if saved.get("recipe") == wanted:
            result.generator, result.reused = Measured((Sample(**saved["generator"]),)), True
            options.log(f"[{result.size.label}] reusing {run_dir}")
            return
    options.log(f"[{result.size.label}] generating {result.chunks:,} chunks into {run_dir} ...")
    marker.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "devtools.scale", "--model", result.size.model, "--layout", result.size.layout,
           "--ranks", str(result.size.ranks), "--threads", str(options.threads), "--hsdp-shard", str(options.hsdp_shard),
           "--out", str(run_dir), "--overwrite", "--no-index"]  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    sample = run_once(cmd, env=_env(), timeout=10 * options.timeout, log=run_dir.parent / f"{result.size.label}.log")
    result.generator = Measured((sample,))
    if sample.code != 0:
        result.skipped = f"generation {'timed out' if sample.timed_out else f'failed (exit {sample.code})'}"
        options.log(f"[{result.size.label}] {result.skipped}: see {run_dir.parent / f'{result.size.label}.log'}")
        return
    marker.write_text(json.dumps({"recipe": wanted, "generator": asdict(sample)}, indent=1))
    options.log(
        f"[{result.size.label}] generated in {sample.wall:.1f} s ({sample.cpu:.1f} CPU s, {sample.peak_mib:.0f} MiB)"
    )


def _tools(result: SizeResult, run_dir: Path, step: Path, root: Path, options: Options) -> None:
    """Every selected tool in every selected state; a state that cannot be produced is noted "n/a"."""
    assert result.world is not None
    label = result.size.label
    caches = root / f"{label}.cache"
    commands = [c for c in tool_commands(step, result.world) if c.key in options.tools]
    result.labels = {c.key: c.label for c in commands}
    cache_kept: bool | None = None  # whether the tools keep a cache (known after a first look)
    for state in options.states:
        if state == "foreign":
            for c in commands:
                result.tools[(c.key, state)] = _repeat(c, options, label, _fresh_caches(caches, f"foreign-{c.key}"))
            cache_kept = any(st.cache_filled(p) for p in caches.glob("foreign-*"))
        elif state == "warm":
            if cache_kept is None and commands:  # no foreign look yet: one tells whether there is a cache
                run_once(list(commands[0].argv), env=_env(caches / "probe"), timeout=options.timeout)
                cache_kept = st.cache_filled(caches / "probe")
            for c in commands:
                if cache_kept:
                    result.tools[(c.key, state)] = _warm(c, caches / f"warm-{c.key}", options, label)
                else:
                    result.tools[(c.key, state)] = f"n/a: the tools leave nothing in ${st.CACHE_ENV} yet"
        elif state == "indexed":
            copy = st.indexed_copy(run_dir, root / f"{label}.indexed", _env())
            indexed = {c.key: c for c in tool_commands(copy, result.world)} if isinstance(copy, Path) else {}
            for c in commands:
                if isinstance(copy, str):
                    result.tools[(c.key, state)] = f"n/a: {copy}"
                else:
                    fresh = _fresh_caches(caches, f"indexed-{c.key}")
                    result.tools[(c.key, state)] = _repeat(indexed[c.key], options, label, fresh)


def _fresh_caches(caches: Path, name: str) -> Callable[[int], Path]:
    """A new, empty cache directory for each run: every run is a first look."""
    return lambda i: caches / f"{name}-{i}"


def _warm(command: Command, cache: Path, options: Options, label: str) -> Measured:
    """The second look: one unmeasured run fills the cache, the measured ones reuse it."""
    run_once(list(command.argv), env=_env(cache), timeout=options.timeout)
    return _repeat(command, options, label, lambda i: cache)


def _repeat(command: Command, options: Options, label: str, cache_of: Callable[[int], Path] | None) -> Measured:
    samples = []
    for i in range(options.repeat):
        env = _env(cache_of(i) if cache_of is not None else None)
        if options.tools_from is not None and command.key in TOOLS:
            env["PYTHONPATH"] = os.pathsep.join([str(options.tools_from), env.get("PYTHONPATH", "")])
        sample = run_once(list(command.argv), env=env, timeout=options.timeout)
        samples.append(sample)
        state = "timeout" if sample.timed_out else f"exit {sample.code}"
        options.log(f"[{label}] {command.label} {i + 1}/{options.repeat}: {sample.cpu:.2f} CPU s,"
                    f" {sample.wall:.2f} s, {sample.peak_mib:.0f} MiB, {state}")  # fmt: skip
        if sample.timed_out:
            break  # the next would time out too
    return Measured(tuple(samples))


def _env(cache: Path | None = None) -> dict[str, str]:
    from devtools.procs import launch_env

    env = launch_env({"PYTHONWARNINGS": "ignore"})
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        env[st.CACHE_ENV] = str(cache)
    return env


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure_floors(options: Options) -> list[tuple[str, Measured]]:
    """The start-up costs every measured process pays, for reading the tables."""
    return [(c.label, _repeat(c, options, "floor", None)) for c in floors()]


def describe_options(options: Options) -> str:
    return (f"{options.repeat} run(s) per command (median), timeout {options.timeout:.0f} s, {os.cpu_count()} CPUs,"
            f" {options.threads} writer files per rank, HSDP shard groups of {options.hsdp_shard}")  # fmt: skip
