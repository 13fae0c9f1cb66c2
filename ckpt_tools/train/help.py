"""``ckpt-train --help``: every flag, what it does, its choices and its default.

draccus's own usage page lists the dataclass fields with few descriptions, no choices and
mostly no defaults. LeRobot users look a flag up by its dotted name, so this page lists each
one once, grouped as the config is. Names, types and defaults are read from the config
dataclasses and the choices from the start-up rules, so the page says what runs; only the
descriptions are written here, and a test holds every flag of the config to one.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_tools.format.rules import startup
from ckpt_tools.train.config import PeftConfig, TrainConfig
from ckpt_tools.train.policies.configs import PolicyConfig

USAGE = """\
usage: ckpt-train --dataset.root=DIR --policy.type=act --output_dir=DIR [--flag=value ...]
       torchrun --nproc-per-node=N $(which ckpt-train) ... [--parallelism.dp_shard=N ...]
       ckpt-train --resume=true --config_path=OUTPUT_DIR/checkpoints/last [--flag=value ...]
       TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --max-restarts=K ... $(which ckpt-train) --resume=auto ...
       ckpt-train ... --dry_run=true    # every check before the first step (dataset, policy, weights), then exit

Train a policy with DDP, FSDP2 or HSDP (one process, or launched by torchrun or accelerate
launch), in LeRobot's flag spelling: --group.field=value. pretrained_model/train_config.json
records exactly what ran; with --resume, flags given override it. docs/training.md has more.
"""

# One line or two per flag: what it does, in the trainer's terms.
FLAG_HELP: dict[str, str] = {
    # the run
    "output_dir": "Where the run writes checkpoints/ and metrics.jsonl.",
    "job_name": "Name of the run (the trackio run name and default project).",
    "seed": "Seed of the initial weights, the data order and each worker's dropout masks.",
    "steps": "Loop steps to train: per-worker micro-batches, not optimizer updates (as in LeRobot).",
    "batch_size": "Samples per worker per step; a step consumes batch_size × dp_world_size samples.",
    "save_freq": "Loop steps between checkpoints; the final step is always saved. Must be a multiple of"
    " --accelerator.gradient_accumulation.steps (a checkpoint never falls inside an accumulation window).",
    "save_checkpoint": "Write checkpoints at all.",
    "log_freq": "Loop steps between logged steps (rank-averaged loss, samples/s, lr).",
    "checkpoint_format": "What pretrained_model/ holds on a sharded run: one gathered model.safetensors,"
    " DCP shards (pytorch_model_fsdp_0/), or both. A non-sharded run always saves safetensors.",
    "checkpoint_async": "Stage the state to host memory and write the checkpoint in the background while"
    " training goes on (at most one save in flight; the same atomic commit and `last` rule).",
    "checkpoint.keep_last_n": "Keep the newest N checkpoints: each save removes older step dirs once it is"
    " committed (never the one `last` points at, the newest resumable one, or one a tool is reading). Unset:"
    " keep all. ckpt-tools prune does the same for a finished run.",
    "checkpoint.last_link": "How checkpoints/last is written: auto = a symlink, a pointer file holding the step"
    " dir's name where the file system refuses symlinks; file = always the pointer file (stores that mangle"
    " symlinks). Every reader takes either.",
    "checkpoint.load_from": "Start this new run (step 0, in --output_dir) from another run's checkpoint: a step"
    " dir, `last`, checkpoints/ or a run's output dir (its `last`); any layout, onto any topology. Without a"
    " --policy.* flag the policy is the one it holds. Not with --resume=true.",
    "checkpoint.load": "The parts of --checkpoint.load_from to load, a comma list of model, optimizer, scheduler,"
    " scaler, rng, or all (a resume's set); the others start fresh (unset: model, the weights only).",
    "resume": "true: continue from --config_path's checkpoint: weights, optimizer, scheduler, loss scaler,"
    " RNG and data position, resharded onto this launch's topology. auto: resume --output_dir's"
    " checkpoints/last (checked as true checks it) if there is one, else start a new run - the same"
    " command for the first launch and every torchrun --max-restarts relaunch (docs/resume.md).",
    "overwrite_checkpoints": "Let a resume save over the checkpoints after the step it resumes from"
    " (refused otherwise). Never carried over by a later resume.",
    "progress_bar": "Show a tqdm progress bar on the main rank.",
    "collective_timeout_s": "Seconds a rank waits for the others in a collective: a rank that died or"
    " stalled ends the job with an error after this, never a hang.",
    "log_samples": "Append the dataset indices each rank consumes per step to"
    " <output_dir>/samples/rank<R>.jsonl (an audit trail of data order).",
    "max_nonfinite_steps": "Optimizer updates the run may skip because the loss (or, without a loss"
    " scaler, the gradient norm) is NaN or infinite; the next one stops it with exit code 7.",
    "config_path": "With --resume=true: the checkpoint to resume (its train_config.json, pretrained_model/,"
    " step dir, `last`, checkpoints/ or run dir). Without: a train_config.json whose values the flags override."
    " With --resume=auto: the config of a new run (and the output dir, unless --output_dir is given); a found"
    " checkpoint resumes from its own train_config.json.",
    # dataset
    "dataset.repo_id": "A Hub dataset (user/name), resolved through the Hugging Face cache (works offline"
    " with HF_HUB_OFFLINE=1 once cached). This or --dataset.root is required.",
    "dataset.root": "A local dataset directory (meta/info.json, meta/stats.json, data/frames.safetensors).",
    "dataset.revision": "Hub revision (branch, tag or commit) of --dataset.repo_id.",
    # policy
    "policy.type": "The policy to build: act (a small ACT transformer), act_tied (ACT with its action head"
    " tied to an embedding), mlp (declares no FSDP wrap units).",
    "policy.path": "Start from a saved policy (a local pretrained_model/, step dir or `last`, or a Hub id):"
    " its config.json and weights. A PEFT adapter is not a policy: pass its base with --peft.*, or resume.",
    "policy.repo_id": "Publish the final pretrained_model/ to this Hub model repo (user/name) after training.",
    "policy.private": "Create the --policy.repo_id repo as private.",
    "policy.state_dim": "Width of observation.state; filled in from the dataset (a different value is refused).",
    "policy.action_dim": "Width of action; filled in from the dataset (a different value is refused).",
    "policy.chunk_size": "Actions predicted per sample (the chunk t … t+chunk_size-1; padded steps past an"
    " episode end are masked in the loss).",
    "policy.dropout": "Dropout probability, in [0, 1].",
    "policy.dim_model": "Transformer width (must be divisible by --policy.n_heads).",
    "policy.n_heads": "Attention heads per layer.",
    "policy.dim_feedforward": "Feed-forward width of each transformer layer.",
    "policy.n_encoder_layers": "Encoder layers (ACTEncoderLayer, each one FSDP wrap unit).",
    "policy.n_decoder_layers": "Decoder layers (ACTDecoderLayer, each one FSDP wrap unit).",
    "policy.n_obs_tokens": "Tokens the state is projected to before the encoder.",
    "policy.hidden_dim": "Width of each hidden layer.",
    "policy.n_layers": "Hidden layers.",
    # optimizer and schedule
    "optimizer.type": "The optimizer.",
    "optimizer.lr": "Learning rate; never scaled automatically with the number of processes (the banner"
    " says what linear scaling would suggest).",
    "optimizer.weight_decay": "AdamW decoupled weight decay (≥ 0).",
    "optimizer.betas": "AdamW betas, two numbers in [0, 1): '[0.9,0.999]'.",
    "optimizer.eps": "AdamW epsilon (≥ 0).",
    "optimizer.grad_clip_norm": "Clip the global gradient norm to this (0 disables clipping).",
    "scheduler.type": "Learning-rate schedule over --steps: cosine (after the warmup) or constant; advanced"
    " once per loop step whatever the number of processes.",
    "scheduler.warmup_steps": "Loop steps of linear warmup.",
    "scheduler.min_lr_ratio": "The fraction of --optimizer.lr the cosine schedule ends at, in [0, 1].",
    # layout
    "parallelism.dp_replicate": "Data-parallel replicas (HSDP: groups of --parallelism.dp_shard ranks);"
    " dp_replicate × dp_shard must equal the processes launched.",
    "parallelism.dp_shard": "Ranks each replica's parameters, gradients and optimizer state are sharded over"
    " (FSDP2); -1: all launched processes divided by dp_replicate. 1×1 on several processes is DDP.",
    # accelerator
    "accelerator.mixed_precision": "Mixed precision: FSDP2's MixedPrecisionPolicy on sharded runs, autocast"
    " otherwise; fp16 also builds a loss scaler (saved as scaler_state.json).",
    "accelerator.gradient_accumulation.steps": "Micro-batches per optimizer update; gradients are reduced"
    " only on the last of each window. effective batch = batch_size × dp_world_size × this.",
    "accelerator.fsdp.wrap_modules": "Module class names that become FSDP units, instead of the policy's"
    " _fsdp_wrap_modules: '[\"ACTEncoderLayer\"]'. Exclusive with --accelerator.fsdp.min_num_params.",
    "accelerator.fsdp.min_num_params": "Make every submodule holding at least this many parameters (not yet"
    " in a unit) an FSDP unit. A value no submodule reaches wraps only the root (a warning says so).",
    "accelerator.fsdp.reshard_after_forward": "Free each unit's gathered parameters after its forward"
    " (false: keep them until the backward; more memory, fewer all-gathers).",
    "accelerator.fsdp.cpu_offload": "Keep sharded parameters, gradients and optimizer state in host memory.",
    "accelerator.fsdp.ignored_modules": "Regex over module paths to keep unsharded (their gradients are"
    " all-reduced by hand); with PEFT the paths start with base_model.model., so start it with .*",
    "accelerator.fsdp.mixed_precision_policy.param_dtype": "FSDP2 MixedPrecisionPolicy param_dtype. Once any"
    " mixed_precision_policy field is set the policy is built from these alone, and this one is required.",
    "accelerator.fsdp.mixed_precision_policy.reduce_dtype": "FSDP2 MixedPrecisionPolicy reduce_dtype"
    " (unset: param_dtype).",
    "accelerator.fsdp.mixed_precision_policy.output_dtype": "FSDP2 MixedPrecisionPolicy output_dtype.",
    "accelerator.fsdp.mixed_precision_policy.cast_forward_inputs": "FSDP2 MixedPrecisionPolicy cast_forward_inputs.",
    # PEFT
    "peft.method_type": "PEFT method. Any --peft.* flag turns PEFT on; it needs --policy.path (the base).",
    "peft.r": "LoRA rank.",
    "peft.lora_alpha": "LoRA alpha (none: --peft.r).",
    "peft.lora_dropout": "Dropout on the LoRA path, in [0, 1].",
    "peft.target_modules": "Linear layers to adapt: '[\"linear1\"]' (none: the policy's linear1, linear2,"
    " state_proj and linear layers, where present).",
    "peft.full_training_modules": "Modules trained in full next to the adapters: '[\"action_head\"]'.",
    # tracking
    "trackio.enable": "Log the rank-reduced metrics and the config with trackio (the `tracking` extra).",
    "trackio.project": "trackio project (none: --job_name, else ckpt-tools).",
    "ema.enable": "Keep an EMA shadow of the weights, saved in pretrained_model_ema/ (LeRobot's update rule).",
    "ema.decay": "Constant EMA decay at every update (none: the warmup schedule below).",
    "ema.update_after_step": "Optimizer updates during which the shadow stays a copy of the weights.",
    "ema.inv_gamma": "Warmup schedule: decay = 1 - (1 + t / inv_gamma) ** -power.",
    "ema.power": "Warmup schedule power.",
    "ema.min_decay": "Lower clamp of the scheduled decay.",
    "ema.max_decay": "Upper clamp of the scheduled decay.",
    "ema.use_for_eval": "LeRobot's flag (evaluate the EMA weights); kept for its spelling, this trainer runs no eval.",
}

# Defaults that are not a plain value of the dataclass.
DEFAULT_TEXT: dict[str, str] = {
    "output_dir": "none (required)",
    "save_freq": f"{startup.DEFAULT_SAVE_FREQ}, rounded up to a multiple of --accelerator.gradient_accumulation.steps",
    "policy.type": "none (required unless --policy.path)",
    "policy.state_dim": "from the dataset",
    "policy.action_dim": "from the dataset",
    "config_path": "none",
    "checkpoint.load": "model (the weights only) when --checkpoint.load_from is given",
}

CHOICES: dict[str, Sequence[str]] = {
    "resume": ("true", "false", "auto"),
    "checkpoint_format": startup.CHECKPOINT_FORMATS,
    "checkpoint.last_link": startup.LAST_LINK_CHOICES,
    "policy.type": tuple(sorted(PolicyConfig.get_known_choices())),
    "optimizer.type": startup.OPTIMIZER_TYPES,
    "scheduler.type": startup.SCHEDULER_TYPES,
    "accelerator.mixed_precision": startup.MIXED_PRECISION_CHOICES,
    "peft.method_type": startup.PEFT_METHODS,
    **{
        f"accelerator.fsdp.mixed_precision_policy.{name}": startup.POLICY_DTYPES
        for name in ("param_dtype", "reduce_dtype", "output_dtype")
    },
}

GROUP_TITLES = {
    "": "Run",
    "dataset": "Dataset",
    "checkpoint": "Checkpoints kept, how `last` is written, and starting from another run's checkpoint",
    "policy": "Policy (fields marked [act, ...] exist on those policy types only)",
    "optimizer": "Optimizer",
    "scheduler": "Schedule",
    "parallelism": "Layout (DDP, FSDP2, HSDP)",
    "accelerator": "Accelerator",
    "peft": "PEFT (LoRA); off unless a --peft.* flag is given",
    "trackio": "Tracking",
    "ema": "EMA of the weights (LeRobot's --ema.* flags)",
}


@dataclass(frozen=True)
class Flag:
    """One dotted flag of the config, as the help page shows it."""

    name: str  # dotted, without the leading --
    metavar: str
    default: str
    choices: tuple[str, ...] = ()
    policy_types: tuple[str, ...] = ()  # policy.* fields only: the types that have it (empty: all)

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0] if "." in self.name else ""


def config_flags() -> list[Flag]:
    """Every leaf flag of :class:`TrainConfig`, in declaration order, plus ``--config_path``."""
    flags: list[Flag] = []
    for name, tp, default in _leaves(TrainConfig, TrainConfig(), ""):
        if name == "policy":
            flags.extend(_policy_flags())
        elif name == "peft":
            flags.extend(_flag(n, t, d) for n, t, d in _leaves(PeftConfig, PeftConfig(), "peft."))
        else:
            flags.append(_flag(name, tp, default))
    flags.append(_flag("config_path", str, None))
    return flags


def _leaves(cls: Any, instance: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """(dotted name, type, default) of each non-dataclass field; ``policy`` and ``peft`` as themselves."""
    out: list[tuple[str, Any, Any]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, value = hints[f.name], getattr(instance, f.name)
        if _optional_dataclass(tp) in (PolicyConfig, PeftConfig):
            out.append((f"{prefix}{f.name}", tp, None))
        elif dataclasses.is_dataclass(value):
            out.extend(_leaves(type(value), value, f"{prefix}{f.name}."))
        else:
            out.append((f"{prefix}{f.name}", tp, value))
    return out


def _optional_dataclass(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)
    return None


def _policy_flags() -> list[Flag]:
    """``--policy.type`` and the union of the registered policy types' fields (which types have each)."""
    choices = PolicyConfig.get_known_choices()
    seen: dict[str, dict[str, tuple[Any, Any]]] = {}
    for type_name, cls in choices.items():
        for name, tp, default in _leaves(cls, cls(), "policy."):
            seen.setdefault(name, {})[type_name] = (tp, default)
    flags = [_flag("policy.type", str, None)]
    for name, by_type in seen.items():
        tp, _ = next(iter(by_type.values()))
        defaults = {type_name: _show(default) for type_name, (_, default) in by_type.items()}
        shown = next(iter(defaults.values())) if len(set(defaults.values())) == 1 else _per_type(defaults)
        owners = () if len(by_type) == len(choices) else tuple(sorted(by_type))
        flag = _flag(name, tp, None)
        flags.append(dataclasses.replace(flag, default=DEFAULT_TEXT.get(name, shown), policy_types=owners))
    return flags


def _per_type(defaults: dict[str, str]) -> str:
    return ", ".join(f"{value} ({type_name})" for type_name, value in sorted(defaults.items()))


def _flag(name: str, tp: Any, default: Any) -> Flag:
    choices = tuple(CHOICES.get(name, ()))
    return Flag(name, _metavar(tp, choices), DEFAULT_TEXT.get(name, _show(default)), choices)


def _metavar(tp: Any, choices: tuple[str, ...]) -> str:
    if choices:
        return "{" + ",".join(choices) + "}"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    inner = args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp
    origin = typing.get_origin(inner)
    if inner is bool:
        return "{true,false}"
    if inner is int:
        return "INT"
    if inner is float:
        return "FLOAT"
    if origin in (list, tuple):
        item = typing.get_args(inner)[0]
        return '["NAME",...]' if item is str else "[X,Y]"
    return "TEXT"


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value))
    return str(value)


def render_help(width: int = 100) -> str:
    """The whole page, grouped as the config is."""
    lines = [USAGE]
    flags = config_flags()
    for group, title in GROUP_TITLES.items():
        members = [f for f in flags if f.group == group]
        if not members:
            continue
        lines.append(f"{title}:")
        for flag in members:
            owners = f" [{', '.join(flag.policy_types)}]" if flag.policy_types else ""
            lines.append(f"  --{flag.name}={flag.metavar}{owners}")
            text = FLAG_HELP[flag.name]
            if flag.choices and not flag.metavar.startswith("{"):
                text += f" Choices: {', '.join(flag.choices)}."
            text += f" Default: {flag.default}."
            lines.extend(textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      "))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["FLAG_HELP", "Flag", "config_flags", "render_help"]
