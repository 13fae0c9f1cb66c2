"""The model card (``README.md``) a push generates from the run's own records.

Everything on the card comes from ``train_config.json`` (what ran), the step's
``training_step.json`` (where it ran: topology, batch factorization) and the files being
published. The card is public, so it must never carry what only makes sense - or should only
be known - on the machine that trained: absolute paths (``dataset.root``, ``output_dir``, a
PEFT base model on local disk) are reduced to their last component, and tokens are masked.
A final pass masks any local path that slipped through, so a new field cannot leak one.

The card is built in memory and uploaded from bytes: it is never written into the user's
checkpoint folder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path, PurePath, PureWindowsPath
from typing import Any

from ckpt_tools.format import layout
from ckpt_tools.format.manifest import is_peft
from ckpt_tools.format.record import BatchFactorization, Topology, TrainingStep, read_training_step
from ckpt_tools.format.train_config import SavedConfig, read_saved_config
from ckpt_tools.hub.files import WEIGHTS, PublishPlan
from ckpt_tools.hub.local_paths import local_strings
from ckpt_tools.io.local_path import is_local_path
from ckpt_tools.io.safe_read import read_json_file
from ckpt_tools.units import human_bytes, human_count

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TAG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_LOCAL_PATH_MASK = "<local path>"


def build_model_card(plan: PublishPlan, *, repo_id: str, secrets: tuple[str, ...] = ()) -> str:
    """The Markdown model card (YAML front matter + body) for publishing ``plan`` as ``repo_id``."""
    config_path = plan.folder / layout.TRAIN_CONFIG
    config = read_saved_config(config_path) if config_path.is_file() else None
    policy = _read_json_object(plan.folder / layout.POLICY_CONFIG)
    adapter = _read_json_object(plan.folder / layout.ADAPTER_CONFIG)
    step = read_training_step(plan.training_step_path) if plan.training_step_path else None
    facts = _Facts(config, policy, adapter, step, plan)
    text = _front_matter(facts) + _body(facts, repo_id)
    return _scrub(
        text, [config.raw if config else {}, policy, adapter, str(plan.folder.resolve()), str(Path.home())], secrets
    )


def public_name(value: str) -> str:
    """``value`` if it is safe to show publicly (a Hub id, a plain name); a local path becomes its basename."""
    if _HUB_ID_RE.match(value) and ".." not in value and not Path(value).exists():
        return value
    if is_local_path(value) or "/" in value or "\\" in value:
        name = PureWindowsPath(value).name if "\\" in value else PurePath(value).name
        return f"{name or '?'} (local path)"
    return value


class _Facts:
    """The card's facts, each from the most precise record that has it (training_step.json first)."""

    def __init__(
        self,
        config: SavedConfig | None,
        policy: dict[str, Any],
        adapter: dict[str, Any],
        step: TrainingStep | None,
        plan: PublishPlan,
    ) -> None:
        # No train_config.json (a bare convert output): every config fact reads as unknown.
        self.config = config or SavedConfig(plan.folder / layout.TRAIN_CONFIG, {})
        self.adapter, self.step, self.plan = adapter, step, plan
        # train_config.json says what ran; a bare convert output may only have the policy's config.json.
        self.policy_type = self.config.policy_type or _str(policy.get("type"))
        self.peft = is_peft(plan.folder, config=config, record=step)
        self.peft_method = self.config.peft_method or ("LORA" if adapter else None)
        self.dataset_id = self.config.dataset_repo_id or None
        self.dataset_root = self.config.dataset_root or None
        self.license = self.config.license or None

    @property
    def public_dataset(self) -> str | None:
        """The dataset's Hub id when it has one (never a local path)."""
        if self.dataset_id and public_name(self.dataset_id) == self.dataset_id and "/" in self.dataset_id:
            return self.dataset_id
        return None

    @property
    def base_model(self) -> str | None:
        value = _str(self.adapter.get("base_model_name_or_path"))
        return public_name(value) if value else None

    def tags(self) -> list[str]:
        tags = ["ckpt-tools", "robotics", "lerobot"]
        for extra in (self.policy_type, "peft" if self.peft else None, self.peft_method if self.peft else None):
            tag = (extra or "").lower()
            if _TAG_RE.match(tag) and tag not in tags:
                tags.append(tag)
        return tags

    def rows(self) -> Iterator[tuple[str, str]]:
        yield "Policy type", f"`{self.policy_type}`" if self.policy_type else "unknown"
        yield "Dataset", self._dataset()
        yield "Steps", self._steps()
        yield "Batch", self._batch()
        yield "Layout", self._layout()
        yield "Precision", self._precision()
        yield "PEFT", self._peft()
        yield "Checkpoint format", self._format()
        yield "Parameters", self._parameters()
        if self.config.seed is not None:
            yield "Seed", str(self.config.seed)
        init = self.config.policy_path
        if init:
            yield "Initialized from", f"`{public_name(init)}`"
        if self.step and self.step.versions:
            yield "Software", ", ".join(f"{k} {v}" for k, v in sorted(self.step.versions.items()))

    def _dataset(self) -> str:
        if self.public_dataset:
            return f"`{self.public_dataset}`"
        if self.dataset_id or self.dataset_root:
            return f"local dataset `{public_name(self.dataset_id or self.dataset_root or '')}`"
        return "unknown"

    def _steps(self) -> str:
        total = self.config.steps
        if self.step is not None:
            return f"{self.step.step}" + (f" of {total} planned" if total is not None else "")
        return str(total) if total is not None else "unknown"

    def _config_topology(self) -> Topology | None:
        """The mesh train_config.json fixes on its own (R×S > 1); 1×1 or dp_shard=-1 follow the launch."""
        r, s = self.config.dp_replicate, self.config.dp_shard
        if r is None or s is None or r < 1 or s < 1 or r * s == 1:
            return None
        return Topology(world_size=r * s, dp_replicate=r, dp_shard=s)

    def _batch(self) -> str:
        if self.step is not None and self.step.batch is not None:
            return self.step.batch.describe()
        batch, accum = self.config.batch_size, self.config.grad_accum_steps or 1
        if batch is None:
            return "unknown"
        topology = self._config_topology()
        if topology is not None:
            return BatchFactorization(batch, topology.dp_world_size, accum).describe()
        return f"batch_size {batch} per worker × grad_accum {accum} (number of workers not recorded)"

    def _layout(self) -> str:
        if self.step is not None and self.step.topology is not None:
            return self.step.topology.describe()
        topology = self._config_topology()
        if topology is not None:
            return topology.describe()
        r, s = self.config.dp_replicate, self.config.dp_shard
        if s == -1:
            return f"sharded over all launched processes (dp_replicate={r}, dp_shard=-1)"
        if r == 1 and s == 1:
            return "DDP or single process"
        return "unknown"

    def _precision(self) -> str:
        mode = (self.step.mixed_precision if self.step else None) or self.config.mixed_precision
        text = {
            "no": "fp32 (no mixed precision)",
            "bf16": "bf16 mixed precision",
            "fp16": "fp16 mixed precision (loss scaling)",
        }.get(mode or "", mode or "unknown")
        dtypes = sorted({d for f in self.plan.weights for d in f.dtypes})
        return text + (f"; published weights {'/'.join(dtypes)}" if dtypes else "")

    def _peft(self) -> str:
        if not self.peft:
            return "no (full weights)"
        rank = self.config.peft_r or _int(self.adapter.get("r"))
        text = f"{self.peft_method or 'yes'}" + (f" (r={rank})" if rank else "")
        return text + (f", base model `{self.base_model}`" if self.base_model else "")

    def _format(self) -> str:
        fmt = self.config.checkpoint_format or (self.step.checkpoint_format if self.step else None)
        published = ", ".join(f"`{f.name}`" for f in self.plan.weights)
        return f"{fmt or 'unknown'} (published: {published})"

    def _parameters(self) -> str:
        counts = [f.num_values for f in self.plan.weights if f.num_values is not None]
        return human_count(sum(counts)) if counts else "unknown"


def _front_matter(facts: _Facts) -> str:
    lines = ["---", "library_name: lerobot"]
    if facts.license and re.match(r"^[A-Za-z0-9.+-]+$", facts.license):
        lines.append(f"license: {facts.license}")
    lines.append("pipeline_tag: robotics")
    lines.append("tags:")
    lines += [f"- {json.dumps(tag)}" for tag in facts.tags()]
    if facts.public_dataset:
        lines += ["datasets:", f"- {json.dumps(facts.public_dataset)}"]
    if facts.peft and facts.base_model and _HUB_ID_RE.match(facts.base_model):
        lines.append(f"base_model: {json.dumps(facts.base_model)}")
    return "\n".join([*lines, "---", ""]) + "\n"


def _body(facts: _Facts, repo_id: str) -> str:
    name = repo_id.rsplit("/", 1)[-1]
    kind = f" of type `{facts.policy_type}`" if facts.policy_type else ""
    what = "A PEFT adapter for a robot policy" if facts.peft else "A robot policy"
    out = [
        f"# {name}",
        "",
        f"{what}{kind}, trained with the ckpt-tools training core (LeRobot-compatible checkpoints)"
        " and published with `ckpt-tools`.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {_cell(value)} |" for key, value in facts.rows()),
        "",
        "## Files",
        "",
        *(f"- `{f.name}` ({human_bytes(f.size)})" for f in facts.plan.files),
        "",
        *_local_paths(facts.plan),
        "## Use",
        "",
        "```bash",
        *_use(facts, repo_id),
        "```",
        "",
    ]
    if facts.peft:
        out[-1:-1] = ["The adapter loads with `peft.PeftModel.from_pretrained(base_policy, repo_id)`.", ""]
    return "\n".join(out)


def _use(facts: _Facts, repo_id: str) -> list[str]:
    """How to use what was published: load the weights, or resume the published step(s)."""
    plan = facts.plan
    if plan.scope == WEIGHTS:
        return [
            f"hf download {repo_id}",
            f"ckpt-train --policy.path={repo_id} ...   # start a new run from these weights",
        ]
    step = plan.folder.parent.name  # the step the card describes: the published one, or the run's last
    return [
        f"hf download {repo_id} --local-dir run   # a run directory: run/checkpoints/{step}/",
        f"ckpt-train --resume=true --config_path=run/checkpoints/{step}   # add --dataset.root=... for a local dataset",
    ]


def _local_paths(plan: PublishPlan) -> list[str]:
    """The card's note on the JSON files published with their local absolute paths set to null."""
    if not plan.rewritten:
        return []
    return [
        "## Local paths",
        "",
        "Local absolute paths are not published: these files are copies with those fields set to `null`"
        " (the local files are unchanged).",
        "",
        *(f"- `{f.name}`: {', '.join(f'`{field}`' for field in f.rewritten)}" for f in plan.rewritten),
        "",
    ]


def _scrub(text: str, sources: list[Any], secrets: tuple[str, ...]) -> str:
    """Mask tokens and any absolute local path found in ``sources`` that reached the card."""
    paths = {s for source in sources for s in local_strings(source)}
    for path in sorted(paths, key=len, reverse=True):
        # Whole path components only: the home dir "/root" must not mangle a repo id "user/rooted".
        text = re.sub(rf"(?<![\w.-]){re.escape(path)}(?![\w.-])", _LOCAL_PATH_MASK, text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; {} when the file is absent; one clear line when it is malformed."""
    if not path.is_file():
        return {}
    data: dict[str, Any] = read_json_file(path, want_object=True)
    return data


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")
