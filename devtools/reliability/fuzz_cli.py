"""Run ``ckpt-tools`` as a forked process of the campaign, with pause points for forced interleavings.

The hostile-string, hostile-number and race families judge what a user sees: the exit code
and every byte of human output. A fresh interpreter per command costs about a second of CPU
(imports); a fork of the campaign, which imported the tools once, costs milliseconds and is
still a separate process: its own file descriptors 1 and 2 (written to files here, through
strict UTF-8 text streams as a real stdout is, so a lone surrogate that reached ``write``
raw is a ``UnicodeEncodeError`` traceback, as it would be), its own signal handlers, its
own locks, and a kill ends it alone.

A *pause point* makes a race reproducible: ``setup`` (run in the child before the command)
patches the tools so that, at a chosen moment (a temporary exists, the first commit, the
deletion), the child calls :func:`pause`: it tells the campaign where it is and blocks until
released. The campaign's ``controller`` then acts - plants a file, replaces an output,
starts a second conversion, sends a signal - and returns; the child goes on. Every
interleaving is a function of the case's seed, never of timing.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import re
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MEMORY_CAP = 2 * 2**30  # bytes of address space a command may add to the campaign's own
DOCUMENTED_EXIT_CODES = frozenset({0, 1, 2, 3, 4, 5})
INTERRUPTED = 130  # a SIGINT / SIGTERM / SIGHUP / SIGQUIT unwound by convert-dcp (docs/tools.md)
# The CLI's push must never reach a network: offline, and a closed loopback endpoint besides.
NO_NETWORK_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
# What a terminal obeys or no encoding can write: C0 but the newline and tab, DEL, C1, the line
# and paragraph separators, bidi embeddings/overrides/isolates, (lone) surrogates.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

CACHE_ENV = "CKPT_TOOLS_CACHE_DIR"  # the tools' index cache: the campaign's own, never the user's
Controller = Callable[[str, int], None]  # (pause point message, child pid): act, then return


@dataclass
class CliRun:
    """One command: its exit code (None: killed at the deadline, a hang), signal, and output."""

    argv: list[str]
    code: int | None
    stdout: str = ""
    stderr: str = ""
    killed_by: int | None = None  # the signal that ended it without unwinding (SIGKILL from a controller)
    points: list[str] = field(default_factory=list)  # pause points reached, in order
    elapsed_s: float = 0.0

    @property
    def name(self) -> str:
        return " ".join(a for a in self.argv[:1] + [a for a in self.argv[1:] if a.startswith("--")])


_CONTROL: tuple[int, int] | None = None  # (write end to the campaign, read end of the release pipe)


def pause(point: str) -> None:
    """In the child: report ``point`` (one line) and wait until the campaign releases it."""
    if _CONTROL is None:
        return
    out, release = _CONTROL
    os.write(out, (point.replace("\n", " ") + "\n").encode("utf-8", "backslashreplace"))
    os.read(release, 1)  # a signal's handler may raise right here: that is the interleaving wanted


def run_cli(
    argv: Sequence[str],
    *,
    timeout: float = 60.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    setup: Callable[[], None] | None = None,
    controller: Controller | None = None,
) -> CliRun:
    """``ckpt-tools ARGV`` in a forked child (memory capped, ``timeout`` wall seconds); see the module doc."""
    import importlib

    from ckpt_tools.cli.app import COMMAND_MODULES

    for module in COMMAND_MODULES.values():  # imported once, here, not in every child
        importlib.import_module(module)
    ctl_r, ctl_w = os.pipe()
    go_r, go_w = os.pipe()
    with tempfile.TemporaryDirectory(prefix="ckpt-fuzz-cli-") as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # never returns
            os.close(ctl_r)
            os.close(go_w)
            _child(list(argv), out_path, err_path, cwd, env, setup, (ctl_w, go_r))
        os.close(ctl_w)
        os.close(go_r)
        code, killed_by, points = _watch(pid, ctl_r, go_w, timeout, controller)
        run = CliRun(list(argv), code, killed_by=killed_by, points=points)
        run.elapsed_s = round(time.monotonic() - started, 3)
        run.stdout = _decoded(out_path.read_bytes())
        run.stderr = _decoded(err_path.read_bytes())
    return run


def _decoded(data: bytes) -> str:
    """Output bytes as text; bytes that are not UTF-8 stay visible as lone surrogates (and count as raw)."""
    return data.decode("utf-8", "surrogateescape")


def _child(
    argv: list[str],
    out_path: Path,
    err_path: Path,
    cwd: Path | None,
    env: dict[str, str] | None,
    setup: Callable[[], None] | None,
    control: tuple[int, int],
) -> None:
    global _CONTROL
    code = 70
    atexit._clear()  # the campaign's exit handlers (its temporary directories' cleanup) are not this process's
    try:
        for fd, path in ((1, out_path), (2, err_path)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        # A real process's streams: stdout strict UTF-8, stderr backslashreplace (Python's own defaults).
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), "utf-8", "strict", line_buffering=True)
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), "utf-8", "backslashreplace", line_buffering=True
        )
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), "utf-8")
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)  # a real process starts with the defaults
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cap = _vm_size() + MEMORY_CAP
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        os.environ.update(NO_NETWORK_ENV)
        os.environ.setdefault(CACHE_ENV, str(Path(tempfile.gettempdir()) / "ckpt-fuzz-cli-cache"))
        os.environ.update(env or {})
        _offline_hub()
        if cwd is not None:
            os.chdir(cwd)
        _CONTROL = control
        if setup is not None:
            setup()
        sys.argv = ["ckpt-tools", *argv]
        from ckpt_tools.cli.app import main

        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print for an uncaught exception
        code = 1
        try:
            sys.stderr.write(traceback.format_exc())
        except BaseException:
            code = 70
    finally:
        try:
            atexit._run_exitfuncs()  # what the interpreter does on exit (a lock's release is one)
        except BaseException:
            code = code or 70
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                code = code or 70
        os._exit(code)


def _offline_hub() -> None:
    """huggingface_hub reads its environment at import: an import before the fork missed ours."""
    try:
        import huggingface_hub.constants as constants
    except ImportError:
        return
    constants.HF_HUB_OFFLINE = True
    constants.ENDPOINT = NO_NETWORK_ENV["HF_ENDPOINT"]


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _watch(
    pid: int, ctl_r: int, go_w: int, timeout: float, controller: Controller | None
) -> tuple[int | None, int | None, list[str]]:
    """Serve the child's pause points until it exits or the deadline passes (then SIGKILL: a hang)."""
    deadline = time.monotonic() + timeout
    points: list[str] = []
    buffer = b""
    hung = False
    with os.fdopen(ctl_r, "rb", buffering=0) as ctl:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                hung = True
                break
            ready, _, _ = select.select([ctl], [], [], left)
            if not ready:
                continue
            data = os.read(ctl.fileno(), 4096)
            if not data:
                break  # the child exited (or closed its end)
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                point = line.decode("utf-8", "backslashreplace")
                points.append(point)
                if controller is not None:
                    controller(point, pid)
                with contextlib.suppress(OSError):  # the controller may have ended it
                    os.write(go_w, b"g")
    os.close(go_w)
    if hung:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if hung:
        return None, None, points
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status), os.WTERMSIG(status), points
    return os.WEXITSTATUS(status), None, points


def raw_lines(text: str) -> list[str]:
    """Lines of ``text`` holding a character a terminal obeys or cannot encode (escaped, for the report)."""
    return [line.encode("ascii", "backslashreplace").decode()[:300] for line in text.splitlines() if RAW.search(line)]


def output_problems(
    run: CliRun, *, allowed: frozenset[int] = DOCUMENTED_EXIT_CODES, json_out: bool = False
) -> list[str]:
    """The rules every command keeps: an exit code of ``allowed`` (documented), no traceback, one
    ``error:`` line when it fails, no raw control character in human output, ``--json`` that parses."""
    what = run.name
    out: list[str] = []
    if run.code is None:
        return [f"{what}: hung (killed at the deadline)"]
    text = run.stdout + run.stderr
    if "Traceback (most recent call last)" in text or run.code == 70:
        out.append(f"{what}: traceback\n{run.stderr[-3000:]}")
    if run.code not in allowed:
        out.append(f"{what}: exit {run.code} is not one of {sorted(allowed)}\n{run.stderr[-1500:]}")
    lines = [line for line in run.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    failed = run.code is not None and run.code >= 2 and run.killed_by is None
    if failed and (len(lines) != 1 or not lines[0].startswith("error: ")):
        out.append(f"{what}: exit {run.code} without exactly one 'error:' line: {[x[:200] for x in lines[:5]]}")
    human = run.stderr if json_out else text
    raw = raw_lines(human)
    if raw:
        out.append(f"{what}: raw control characters in human output: {raw[:3]}")
    if json_out and run.code in (0, 1) and run.stdout.strip():
        try:
            run.stdout.encode("ascii")
            json.loads(run.stdout)
        except (UnicodeError, ValueError) as e:
            out.append(f"{what}: --json output is not ASCII JSON ({e})")
    return out
