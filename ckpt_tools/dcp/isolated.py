"""Read a large ``.metadata`` with C's unpickler, in a separate process with capped CPU time and memory.

The restricted pure-Python unpickler (:mod:`ckpt_tools.dcp.safe_pickle`) intercepts every
opcode, which costs a few microseconds per opcode: minutes for the 400 MB ``.metadata`` of a
70B model saved by 1024 ranks, several times torch's own read. C's unpickler is an order of
magnitude faster, but two of its behaviours cannot be intercepted: ``BUILD`` on any object on
its stack, and hashing whatever it is given as a dict key (a tuple of shared tuples 60 levels
deep hashes 2**60 leaves; a ``LONG_BINPUT`` of index 2**30 allocates gigabytes). So it runs here
in a worker process that the checkpoint cannot harm us through:

- the worker is a fresh interpreter (``python -m ckpt_tools.dcp.isolated``) that reads the file
  from a descriptor it inherits, limits its own CPU time and address space in proportion to
  the file's size before reading a byte, and exits; nothing it builds or changes reaches the
  caller's process, which only ever receives bytes;
- it resolves globals through the same allowlist as the restricted unpickler, whose stand-ins
  are frozen (classes, functions and dtype stand-ins refuse every change), so no code runs;
- it converts with the same conversion (:func:`ckpt_tools.dcp.metadata.table_of`) and sends
  the table as an index file (:mod:`ckpt_tools.dcp.index_file`), which the caller reads with
  the hardened index reader: the worker's answer is checked like any file.

A worker killed by its CPU or memory limit is a refusal ("more work than a file of its size
can need"), not a hang and not a crash of the caller.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ckpt_tools.dcp.table import ChunkTable
from ckpt_tools.errors import CheckpointError, CorruptCheckpoint, UnsafeCheckpoint

CPU_SECONDS_BASE = 5  # the worker starts in under a second
CPU_SECONDS_PER_MIB = 1.0  # real files: about 0.05 s per MiB
MEMORY_PER_BYTE = 40  # real files: about 15 bytes of objects per byte of .metadata
MEMORY_BASE = 1 << 30
OUTPUT_PER_BYTE = 16  # the index is smaller than the pickle for every real file
EXIT_CORRUPT = 3  # the worker's exit codes (ckpt_tools.dcp.isolated_worker)
EXIT_UNSAFE = 5


def available() -> bool:
    """Whether workers can be started here with resource limits (POSIX with an interpreter path)."""
    try:
        import resource  # noqa: F401 - POSIX only
    except ImportError:
        return False
    return bool(sys.executable)


def cpu_limit(size: int) -> int:
    return int(CPU_SECONDS_BASE + CPU_SECONDS_PER_MIB * size / 2**20)


def parse(fd: int, size: int, *, what: str) -> ChunkTable:
    """The table of the ``.metadata`` open at ``fd`` (``size`` bytes), parsed in a worker."""
    from ckpt_tools.dcp.index_file import IndexRefused, read_index

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "ckpt_tools.dcp.isolated_worker", str(fd), str(size), what]
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(fd,), env=env
        )
    except OSError as e:
        raise CheckpointError(f"{what}: cannot start the metadata reader ({e.strerror or e})") from None
    try:
        out, err = proc.communicate(timeout=2 * cpu_limit(size) + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise CorruptCheckpoint(
            f"{what}: reading it took longer than a file of its size can need (a pickle bomb?)"
        ) from None
    message = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
    if proc.returncode == EXIT_UNSAFE:
        raise UnsafeCheckpoint(message[0] if message else f"{what}: refused")
    if proc.returncode == EXIT_CORRUPT:
        raise CorruptCheckpoint(message[0] if message else f"{what}: not a valid DCP .metadata")
    if proc.returncode != 0:
        raise CorruptCheckpoint(
            f"{what}: reading it needed more CPU time or memory than a file of its size can need (a pickle bomb?)"
        )
    if len(out) > OUTPUT_PER_BYTE * size + (16 << 20):
        raise CorruptCheckpoint(f"{what}: describes more than a file of its size can")
    try:
        table, _ = read_index(out, what=what)
    except IndexRefused as e:
        raise CorruptCheckpoint(f"{what}: the metadata reader's answer did not check out ({e})") from None
    return table
