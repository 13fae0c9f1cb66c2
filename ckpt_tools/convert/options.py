"""What a conversion is asked to do: every ``convert-dcp`` option, declared, defaulted and validated here once.

``ckpt-tools convert-dcp`` (Typer), ``lerobot-convert-dcp`` (LeRobot's flag spelling), the
Hub publisher and Python callers all build one :class:`ConvertOptions` and hand it on, so an
option added here reaches every front-end without a second list of keywords to keep in step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from ckpt_tools.errors import UsageError
from ckpt_tools.st import dtypes
from ckpt_tools.st.dtypes import DType
from ckpt_tools.st.writer import parse_size

WHAT_CHOICES = ("model", "optimizer")
AS_SAVED = ("", "keep", "auto")  # --dtype spellings meaning: every tensor keeps its saved dtype


@dataclass(frozen=True)
class ConvertOptions:
    """The options of one conversion; :meth:`checked` refuses bad values and combinations in one line.

    ``output``: a directory, or a ``.safetensors`` file path when unsharded (default: next to
    the shards, see :func:`ckpt_tools.convert.plan.default_output_dir`). ``dtype``: ``fp32`` /
    ``bf16`` / ``fp16`` for floating tensors (default: as saved). ``max_shard_size``: bytes or
    ``2GB``-style, for Hub-style shards and an index. ``what``: ``model`` or ``optimizer``
    (default: ``model``, or what a DCP dir given directly holds). ``key``: the dotted key path
    of the part to convert (``app.model``; default: the model, found by its shape).
    ``overwrite``: replace existing output files (else refused, unless they already hold
    exactly the planned bytes). ``verify``: re-read every written byte before committing
    (always done with ``delete_dcp``). ``progress``: a progress bar on a terminal.
    ``delete_dcp``: then delete the DCP dir, only when what remains resumes bit-exactly, or
    with ``allow_unresumable`` (which waives only that rule). ``ema``: convert the EMA weights
    (``pretrained_model_ema/``) instead of the live ones. ``dry_run``: plan, write nothing.
    """

    output: str | os.PathLike[str] | None = None
    dtype: str | None = None
    max_shard_size: str | int | None = None
    what: str | None = None
    key: str | None = None
    overwrite: bool = False
    verify: bool = False
    progress: bool = True
    delete_dcp: bool = False
    allow_unresumable: bool = False
    ema: bool = False
    dry_run: bool = False

    def but(self, **changes: Any) -> ConvertOptions:
        """These options with ``changes`` (field names as keywords; an unknown one is a ``TypeError``)."""
        return replace(self, **changes) if changes else self

    def checked(self) -> ConvertOptions:
        """These options, or :class:`~ckpt_tools.errors.UsageError` (exit 2) naming the flag that is wrong."""
        if self.ema and self.what not in (None, "model"):
            raise UsageError(f"--ema converts the EMA weights, a model: not with --what {self.what}")
        if self.ema and self.delete_dcp:
            raise UsageError(
                "--ema with --delete-dcp: deleting the EMA shards is not supported; convert, then keep them"
            )
        self.output_dtype  # noqa: B018 - parsed for its refusal
        self.shard_limit  # noqa: B018
        if self.what is not None and self.what not in WHAT_CHOICES:
            raise UsageError(f"--what must be one of {', '.join(WHAT_CHOICES)}, got {self.what!r}")
        return self

    @property
    def output_dtype(self) -> DType | None:
        """The dtype floating tensors are cast to (None: each keeps its saved dtype)."""
        if self.dtype is None or self.dtype in AS_SAVED:
            return None
        name = dtypes.OUTPUT_DTYPES.get(self.dtype.lower(), dtypes.canonical_name(self.dtype.lower()))
        if name not in dtypes.OUTPUT_DTYPES.values():
            raise UsageError(f"--dtype must be one of {', '.join(dtypes.OUTPUT_DTYPES)}, got {self.dtype!r}")
        return dtypes.BY_NAME[name]

    @property
    def shard_limit(self) -> int | None:
        """The most tensor bytes per output file (None: one file)."""
        return parse_size(self.max_shard_size) if self.max_shard_size is not None else None

    @property
    def what_given(self) -> bool:
        """Whether the caller chose model or optimizer (else the DCP dir's contents decide)."""
        return self.what is not None
