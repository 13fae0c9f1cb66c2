"""``inspect``: what a checkpoint path holds and whether it is healthy - from headers only.

Works on a checkpoints root, a step dir, ``pretrained_model/``, ``training_state/``, a DCP
dir (rank-local metadata and torch's zstd extension included), a single ``.safetensors`` file or
a folder of them (``convert-dcp --max-shard-size`` output, torch's HF storage writer: its
distributed pieces are shown as pieces of the tensors they belong to, never as whole tensors).
It reads ``training_step.json``, DCP ``.metadata``, the few hundred header bytes of each chunk
archive and each safetensors header - never tensor data - so it takes the same fraction of a
second on any model size.

Health checks (:class:`ckpt_tools.check.Check`) pass, or have one of two severities: ``fail``
(the checkpoint is broken: a file the layout requires is missing, metadata is inconsistent,
chunks do not tile a tensor, a file is truncated) and ``warn`` (worth knowing, still loadable:
a crashed partial save, an unreferenced shard file, the 0.6.x layout that cannot resume, a
*leftover* - the hidden temporary file of a killed write or the moved-aside directory of an
interrupted ``convert-dcp --delete-dcp``, named as :mod:`ckpt_tools.io.fsutil` names them).
``healthy`` is true when no check failed.

``check_values=True`` (``inspect --check-values``) also reads every tensor's data, a block at a
time (:mod:`ckpt_tools.inspect.values`), and fails a ``<file> values`` check for each weights or
optimizer container holding NaN or infinite values, listing them in ``nonfinite``.
``verify_data=True`` (``inspect --verify-data``) also reads every byte of every file the step's
save recorded against the full digests it computed as it wrote them (:mod:`.records`). Both
report the bytes they read to the command's progress bar (:mod:`ckpt_tools.io.progress`).

    entry.py        inspect_path: which reader a path's kind takes
    report.py       InspectReport and the summaries it holds (what --json prints)
    roots.py        a checkpoints root (last, partial saves, retention), another trainer's step-N/ folder
    steps.py        one step dir: training_step.json, expected files, every container, the EMA weights
    records.py      the save's record of its files: the save-files and data-digests checks
    safetensors.py  files, indexes, folders of safetensors, torch's HF-storage pieces
    dcp.py          DCP dirs: metadata, chunk tiling, chunk archives, ranks
    checks.py       what every container shares: a header check, a values check, leftovers
    values.py       NaN and infinity counts of saved tensors, a block at a time (--check-values)
    ema.py          the step's EMA weights against the live model's names, shapes and dtypes
"""

from ckpt_tools.inspect.entry import inspect_path
from ckpt_tools.inspect.report import InspectReport, RetentionView, StepSummary, TensorInfo, WeightsSummary
from ckpt_tools.inspect.values import NonFinite, ValueScan

__all__ = [
    "InspectReport",
    "NonFinite",
    "RetentionView",
    "StepSummary",
    "TensorInfo",
    "ValueScan",
    "WeightsSummary",
    "inspect_path",
]
