"""THE HOOK: the chunk index the trainer writes beside ``.metadata``, written into a generated DCP directory.

The trainer indexes every DCP directory it saves (``.metadata.index``, read by the tools instead
of the pickle); a generated checkpoint gets the same file from the same function, given the
``Metadata`` torch reads back from the directory. This module is the one place the benchmark
(and ``python -m devtools.scale --index``) reaches into ckpt_tools for it: if that API moves,
change :func:`write_trainer_index` and nothing else. While this checkout has no index writer,
it says so and the ``indexed`` state reads "n/a".

    python -m devtools.scale.trainer_index DCP_DIR...    # exit 3: no index writer in this checkout
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

NO_WRITER = 3


class NoIndexWriter(Exception):
    """This checkout of ckpt_tools writes no chunk index."""


def available() -> bool:
    """Whether this checkout's trainer indexes its saves (then a faithful generated step has the index too)."""
    try:
        from ckpt_tools.train.checkpoint.save_index import write_save_index  # noqa: F401
    except ImportError:
        return False
    return True


def write_trainer_index(directory: Path, metadata: Any | None = None) -> None:
    """Index ``directory`` as the trainer's save does (``metadata``: its ``Metadata``; None: read it back)."""
    try:
        from ckpt_tools.train.checkpoint.save_index import write_save_index  # the trainer's own
    except ImportError as e:
        raise NoIndexWriter(f"no index writer in this checkout ({e})") from None
    if metadata is None:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(directory).read_metadata()
    write_save_index(directory, metadata)


def main(argv: list[str]) -> int:
    try:
        for directory in argv:
            write_trainer_index(Path(directory))
    except NoIndexWriter as e:
        print(f"error: {e}", file=sys.stderr)
        return NO_WRITER
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
