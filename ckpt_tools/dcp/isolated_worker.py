"""The worker of :mod:`ckpt_tools.dcp.isolated`: run as ``python -m ckpt_tools.dcp.isolated_worker FD SIZE WHAT``.

It limits its own CPU time and memory, reads the ``.metadata`` open at ``FD`` with C's
unpickler (globals from the allowlist only), converts it with the in-process reader's
conversion and writes the chunk index to stdout. A module of its own, so that the reader
(:mod:`ckpt_tools.dcp.metadata`) and the parent side it calls do not import each other.
"""

from __future__ import annotations

import contextlib
import os
import sys

from ckpt_tools.dcp.isolated import EXIT_CORRUPT, EXIT_UNSAFE, MEMORY_BASE, MEMORY_PER_BYTE, cpu_limit
from ckpt_tools.errors import CorruptCheckpoint, UnsafeCheckpoint


def _limit_self(size: int) -> None:
    import resource

    seconds = cpu_limit(size)
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
    memory = MEMORY_BASE + MEMORY_PER_BYTE * size + _virtual_size()
    # A platform without address-space limits (macOS): the CPU limit still ends a bomb.
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def _virtual_size() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _worker(fd: int, size: int, what: str) -> int:
    import copyreg
    import gc
    import pickle

    _limit_self(size)
    gc.disable()  # millions of acyclic objects: collections would only walk them again and again
    # EXT opcodes resolve through these process-wide tables, bypassing find_class; empty them.
    for table in ("_extension_registry", "_inverted_registry", "_extension_cache"):
        getattr(copyreg, table).clear()

    from ckpt_tools.dcp.index_file import Binding, index_bytes
    from ckpt_tools.dcp.metadata import METADATA_ALLOWLIST, RECORD_KINDS, table_of
    from ckpt_tools.dcp.safe_pickle import sandbox_allowlist

    allowed = sandbox_allowlist(METADATA_ALLOWLIST)

    class Loader(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            found = allowed.get((module, name)) if type(module) is str and type(name) is str else None
            if found is None:
                raise UnsafeCheckpoint(
                    f"{what}: refused to load global {str(module)[:100]}.{str(name)[:100]}"
                    " (checkpoint pickles may only hold data)"
                )
            return found

        def persistent_load(self, pid: object) -> object:
            raise UnsafeCheckpoint(f"{what}: refused a persistent reference (not expected in this file)")

    try:
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            n = os.preadv(fd, [view[got:]], got)
            if n <= 0:
                raise CorruptCheckpoint(f"{what}: changed while it was read")
            got += n
        os.close(fd)
        import io

        raw = Loader(io.BytesIO(data), fix_imports=False).load()
        del data, view
        chunks = table_of(raw, RECORD_KINDS, size=size, what=what)
        del raw
        sys.stdout.buffer.write(index_bytes(chunks, Binding(metadata_size=size, metadata_sha256=None)))
        sys.stdout.buffer.flush()
    except UnsafeCheckpoint as e:
        print(str(e), file=sys.stderr)
        return EXIT_UNSAFE
    except CorruptCheckpoint as e:
        print(str(e), file=sys.stderr)
        return EXIT_CORRUPT
    except RecursionError:
        print(f"{what}: not a valid pickle (nested too deeply)", file=sys.stderr)
        return EXIT_CORRUPT
    except MemoryError:
        return 1
    except Exception as e:  # whatever C's unpickler raises on malformed input
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        print(f"{what}: not a valid pickle ({first})", file=sys.stderr)
        return EXIT_CORRUPT
    return 0


if __name__ == "__main__":
    sys.exit(_worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
