"""What ``inspect`` reports: :class:`InspectReport` and the summaries it holds.

``InspectReport.to_dict`` (what ``inspect --json`` prints) holds every field of the report
plus ``healthy``; each check is ``{"name", "status", "message"}``, the shape ``verify-resume``
and ``reshard-plan`` use too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckpt_tools.check import Check, Subject
from ckpt_tools.dcp.index import RankShard
from ckpt_tools.format.record import TrainingStep
from ckpt_tools.inspect.values import NonFinite


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[dict[str, Any], ...] = ()  # DCP only: offsets, sizes, file


@dataclass(frozen=True)
class WeightsSummary:
    """One weights container: a safetensors file (or index) or a DCP directory."""

    path: str
    format: str  # "safetensors" or "dcp"
    tensors: int
    parameters: int
    bytes: int
    bytes_by_dtype: dict[str, int]
    parameters_by_dtype: dict[str, int]
    ranks: tuple[RankShard, ...] = ()
    top_level_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepSummary:
    name: str
    step: int | None
    healthy: bool
    failed_checks: int


@dataclass
class RetentionView:
    """What retention of the newest ``keep_last_n`` would do to a checkpoints root (nothing is removed)."""

    keep_last_n: int
    source: str  # "--keep-last", or the train_config.json the run's --checkpoint.keep_last_n came from
    removes: list[str] = field(default_factory=list)
    keeps: dict[str, list[str]] = field(default_factory=dict)  # step name -> why it stays


@dataclass
class InspectReport:
    path: str
    kind: str
    checks: list[Check] = field(default_factory=list)
    checkpoint: str | None = None  # the step dir read, absolute, `last` followed (check.Subject)
    step: int | None = None
    formats: list[str] = field(default_factory=list)
    peft: bool | None = None
    processors: list[str] = field(default_factory=list)
    training_step: dict[str, Any] | None = None
    topology: str | None = None
    batch: str | None = None
    initialized_from: str | None = None  # a run started from another's parts (--checkpoint.load_from)
    legacy: bool = False
    weights: list[WeightsSummary] = field(default_factory=list)
    steps: list[StepSummary] = field(default_factory=list)
    last: str | None = None
    partial_saves: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # interrupted writes and deletions, relative paths
    inspected_step: str | None = None
    tensors: list[TensorInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    values_checked: bool = False  # every tensor's data was read (check_values)
    data_checked: bool = False  # every recorded byte was to be read (verify_data)
    data_verified: bool = False  # every recorded byte was read against the save's full digests (verify_data)
    data_bytes: int = 0  # bytes read for it
    data_gb_per_s: float | None = None  # the speed it read and digested them at
    nonfinite: list[NonFinite] = field(default_factory=list)  # tensors holding NaN or inf (values_checked)
    retention: RetentionView | None = None  # what --keep-last / the run's keep_last_n would remove (a root)
    ema: dict[str, Any] | None = None  # the step's EMA weights (ckpt_tools.inspect.ema); None: it has none

    @property
    def healthy(self) -> bool:
        return not any(c.failed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["healthy"] = self.healthy
        for w in out["weights"]:
            for r in w["ranks"]:
                r["files"] = list(r["files"])
        return out


def set_subject(report: InspectReport, step_dir: Path, record: TrainingStep | None) -> None:
    """``checkpoint``, ``step`` and ``topology`` as ``verify-resume`` reports them (:class:`Subject`)."""
    subject = Subject.of(step_dir, record)
    report.checkpoint, report.step, report.topology = subject.checkpoint, subject.step, subject.topology
