"""Run LeRobot's own checkpoint loaders on one step directory and print one line per part.

Runs under LeRobot's Python (0.6.1 or main), started by ``bin/make-lerobot-fixtures probe``.
Each part calls LeRobot's function as ``lerobot-train --resume`` would and prints
``<part>: OK ...``, ``<part>: FAIL <ExceptionType>: <message>`` or ``<part>: SKIP <why>``.
Nothing is fixed up between parts: a part that needs an object an earlier part failed to
build uses the closest stand-in and says so.

Stand-ins, when LeRobot cannot build the policy from ``config.json`` (checkpoints written by
another trainer): the optimizer is LeRobot's ``AdamWConfig(...).build(...)`` over a module that
has the checkpoint's own parameter names and shapes (from ``model.safetensors`` or the DCP model
metadata; parameters in the order ``optimizer_param_groups.json`` lists them when it lists names,
or ckpt-train's names by position from the ``optimizer_state.safetensors`` metadata),
so the loaders are exercised on exactly the tensors the checkpoint describes.

    python probe_loaders.py STEP_DIR              # single process: every file-level loader
    torchrun --nproc-per-node=2 probe_loaders.py --sharded STEP_DIR
                                                  # main only: the FSDP2/DCP resume loaders
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

RANK = int(os.environ.get("RANK", "0"))


def say(part: str, status: str, detail: str = "") -> None:
    if RANK == 0:
        print(f"{part}: {status}{' ' + detail if detail else ''}", flush=True)


def run(part: str, fn, *args, **kwargs) -> Any:
    """Call ``fn``; print OK (with what it returned, briefly) or the exact exception."""
    try:
        out = fn(*args, **kwargs)
    except BaseException as e:  # every failure is a result here, not a crash
        if isinstance(e, KeyboardInterrupt):
            raise
        msg = " ".join(str(e).split())
        say(part, "FAIL", f"{type(e).__name__}: {msg[:600]}")
        if os.environ.get("PROBE_TRACEBACK"):
            traceback.print_exc()
        return None
    say(part, "OK", _brief(out))
    return out


def _brief(out: Any) -> str:
    if out is None:
        return "-> None"
    if isinstance(out, (int, float, str)):
        return f"-> {out!r}"
    if isinstance(out, dict) and len(json.dumps(out, default=str)) < 300:
        return f"-> {json.dumps(out, default=str)}"
    return f"-> {type(out).__name__}"


def lerobot_flavor() -> str:
    from lerobot.common import train_utils

    return "main" if hasattr(train_utils, "load_training_metadata") else "0.6.1"


# -- stand-in module -----------------------------------------------------------------------------


def checkpoint_tensors(pretrained: Path) -> dict[str, tuple[list[int], Any]]:
    """Names -> (shape, torch dtype) of the model tensors, from model.safetensors or DCP metadata."""
    import torch
    from safetensors import safe_open

    st = pretrained / "model.safetensors"
    if st.is_file():
        out = {}
        with safe_open(str(st), "pt") as f:
            for k in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                sl = f.get_slice(k)
                out[k] = (list(sl.get_shape()), getattr(torch, _ST_DTYPES.get(sl.get_dtype(), "float32")))
        return out
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(pretrained / "pytorch_model_fsdp_0")).read_metadata()
    out = {}
    for k, v in md.state_dict_metadata.items():
        if isinstance(v, TensorStorageMetadata):
            out[k.removeprefix("model.")] = (list(v.size), v.properties.dtype)
    return out


_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64"}


def standin_module(pretrained: Path, param_order: list[str] | None):
    import torch
    from torch import nn

    tensors = checkpoint_tensors(pretrained)
    params = set(param_order) if param_order else {k for k, (_, dt) in tensors.items() if dt.is_floating_point}
    root = nn.Module()
    for name, (shape, dtype) in tensors.items():
        *path, leaf = name.split(".")
        mod = root
        for p in path:
            if not hasattr(mod, p):
                mod.add_module(p, nn.Module())
            mod = getattr(mod, p)
        t = torch.zeros(shape, dtype=dtype)
        if name in params:
            mod.register_parameter(leaf, nn.Parameter(t))
        else:
            mod.register_buffer(leaf, t)
    return root


def saved_param_names(ts: Path) -> list[str] | None:
    path = ts / "optimizer_param_groups.json"
    if not path.is_file():
        return None
    groups = json.loads(path.read_text())
    if isinstance(groups, dict):
        groups = groups.get("param_groups", [])
    names = [p for g in groups for p in g.get("params", [])]
    if names and all(isinstance(n, str) for n in names):
        return names
    return metadata_param_names(ts)


def metadata_param_names(ts: Path) -> list[str] | None:
    """Names by position a ckpt-train checkpoint keeps in optimizer_state.safetensors' metadata (None: none)."""
    from safetensors import safe_open

    path = ts / "optimizer_state.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as f:
        text = (f.metadata() or {}).get("ckpt_tools.param_names")
    return json.loads(text) if text else None


def saved_lr(ts: Path) -> float:
    path = ts / "optimizer_param_groups.json"
    try:
        groups = json.loads(path.read_text())
        if isinstance(groups, dict):
            groups = groups["param_groups"]
        return float(groups[0].get("initial_lr", groups[0]["lr"]))
    except Exception:
        return 1e-4


# -- the probe -----------------------------------------------------------------------------------


def build_objects(step: Path, flavor: str) -> dict[str, Any]:
    """Config, policy, optimizer and scheduler the way lerobot-train builds them (stand-ins if not)."""
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.optim import AdamWConfig, CosineDecayWithWarmupSchedulerConfig
    from lerobot.policies.factory import get_policy_class

    pretrained, ts = step / "pretrained_model", step / "training_state"
    objs: dict[str, Any] = {}
    objs["policy_cfg"] = run(
        "config.json (PreTrainedConfig.from_pretrained)", PreTrainedConfig.from_pretrained, pretrained
    )
    cfg = run(
        "train_config.json (TrainPipelineConfig.from_pretrained)", TrainPipelineConfig.from_pretrained, pretrained
    )
    objs["cfg"] = cfg if isinstance(cfg, TrainPipelineConfig) else None
    policy = None
    if objs["policy_cfg"] is not None:
        pcfg = objs["policy_cfg"]
        pcfg.device = "cpu"
        policy_cls = get_policy_class(pcfg.type)
        if (pretrained / "model.safetensors").is_file():
            policy = run(
                "model.safetensors (policy_cls.from_pretrained)", policy_cls.from_pretrained, pretrained, config=pcfg
            )
        else:
            say("model.safetensors (policy_cls.from_pretrained)", "SKIP", "no model.safetensors (DCP-only)")
            policy = run("policy from config.json (policy_cls(config))", policy_cls, pcfg)
    else:
        say("model.safetensors (policy_cls.from_pretrained)", "SKIP", "no LeRobot policy config")
    objs["policy"] = policy if isinstance(policy, torch.nn.Module) else None
    from lerobot.processor import PolicyProcessorPipeline

    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        if (pretrained / name).is_file():
            run(
                f"{name} (PolicyProcessorPipeline.from_pretrained)",
                PolicyProcessorPipeline.from_pretrained,
                pretrained,
                config_filename=name,
            )
        else:
            say(f"{name} (PolicyProcessorPipeline.from_pretrained)", "SKIP", "file absent")

    names = saved_param_names(ts)
    if objs["policy"] is not None and objs["cfg"] is not None:
        from lerobot.optim.factory import make_optimizer_and_scheduler

        built = run(
            "optimizer+scheduler (make_optimizer_and_scheduler)",
            make_optimizer_and_scheduler,
            objs["cfg"],
            objs["policy"],
        )
        objs["optimizer"], objs["scheduler"] = built if isinstance(built, tuple) else (None, None)
        objs["standin"] = False
    else:
        objs["optimizer"] = objs["scheduler"] = None
    if objs["optimizer"] is None:
        module = objs["policy"]
        if module is None:
            module = run("stand-in module (checkpoint names/shapes)", standin_module, pretrained, names)
        if isinstance(module, torch.nn.Module):
            lr = saved_lr(ts)
            if names and objs["policy"] is None:
                by_name = dict(module.named_parameters())
                params = [by_name[n] for n in names if n in by_name]
            elif objs["policy"] is not None and objs["policy_cfg"] is not None:
                params = objs["policy"].get_optim_params()
            else:
                params = list(module.parameters())
            objs["optimizer"] = AdamWConfig(lr=lr, weight_decay=1e-4).build(params)
            objs["module"] = module
            objs["standin"] = objs["policy"] is None
        if objs["optimizer"] is not None and (ts / "scheduler_state.json").is_file():
            objs["scheduler"] = CosineDecayWithWarmupSchedulerConfig(
                num_warmup_steps=0, num_decay_steps=100, peak_lr=lr, decay_lr=lr * 0.1
            ).build(objs["optimizer"], 100)
    objs.setdefault("module", objs["policy"])
    if objs.get("standin"):
        say(
            "optimizer used below",
            "NOTE",
            "LeRobot AdamWConfig.build over a stand-in module with the checkpoint's names/shapes",
        )
    return objs


def loaded_state_fits(optimizer) -> str:
    """torch's load_state_dict maps state by position without checking shapes: check every moment fits."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with_state = [p for p in params if p in optimizer.state]
    for i, p in enumerate(params):
        for slot, value in optimizer.state.get(p, {}).items():
            if slot != "step" and tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"position {i}: {slot} {tuple(value.shape)} != parameter {tuple(p.shape)}")
    return f"{len(with_state)} of {len(params)} parameters have state, every moment its parameter's shape"


def probe(step: Path) -> None:
    flavor = lerobot_flavor()
    import lerobot

    say("lerobot", "INFO", f"{flavor} ({getattr(lerobot, '__version__', '?')}) at {Path(lerobot.__file__).parent}")
    ts = step / "training_state"
    objs = build_objects(step, flavor)
    from lerobot.utils.random_utils import load_rng_state

    if flavor == "0.6.1":
        from lerobot.common.train_utils import (
            load_training_batch_size,
            load_training_num_processes,
            load_training_state,
            load_training_step,
        )
        from lerobot.optim.optimizers import load_optimizer_state_dict

        run("training_step.json (load_training_step)", load_training_step, ts)
        run("training_step.json (load_training_num_processes)", load_training_num_processes, step)
        run("training_step.json (load_training_batch_size)", load_training_batch_size, step)
    else:
        from lerobot.common.train_utils import load_training_metadata

        run("training_step.json (load_training_metadata)", load_training_metadata, ts)
    run("rng_state.safetensors (load_rng_state)", load_rng_state, ts)

    from lerobot.optim import load_optimizer_state, load_scheduler_state

    opt, sched = objs["optimizer"], objs["scheduler"]
    if (ts / "optimizer_state.safetensors").is_file():
        if flavor == "0.6.1":
            run("optimizer_state.safetensors (load_optimizer_state_dict, the FSDP path)", load_optimizer_state_dict, ts)
        if opt is not None:
            if run("optimizer_state.safetensors (load_optimizer_state)", load_optimizer_state, opt, ts) is not None:
                run("optimizer_state.safetensors (loaded state shaped like its parameters)", loaded_state_fits, opt)
        else:
            say("optimizer_state.safetensors (load_optimizer_state)", "SKIP", "no optimizer could be built")
    else:
        say("optimizer_state.safetensors (load_optimizer_state)", "SKIP", "file absent (sharded: see --sharded)")
    if (ts / "scheduler_state.json").is_file():
        if sched is not None:
            run("scheduler_state.json (load_scheduler_state)", load_scheduler_state, sched, ts)
        else:
            say("scheduler_state.json (load_scheduler_state)", "SKIP", "no scheduler could be built")
    else:
        say("scheduler_state.json (load_scheduler_state)", "SKIP", "file absent (the run had no scheduler)")

    if flavor == "0.6.1":
        if opt is not None:
            run("whole (load_training_state)", lambda: load_training_state(step, opt, sched)[0])
            # 0.6.1 under FSDP calls it with load_optimizer=False and reshards the optimizer after
            # prepare() (load_fsdp_optimizer_state, whose file-level half is load_optimizer_state_dict above).
            run(
                "whole, FSDP resume (load_training_state, load_optimizer=False)",
                lambda: load_training_state(step, opt, sched, load_optimizer=False)[0],
            )
        else:
            say("whole (load_training_state)", "SKIP", "no optimizer could be built")
        return
    from lerobot.common.train_utils import resume_after_prepare, resume_before_prepare

    cfg = objs["cfg"]
    if cfg is None:
        say("whole (resume_before_prepare / resume_after_prepare)", "SKIP", "train_config.json did not parse")
        return
    cfg.resume = True
    cfg.checkpoint_path = step
    run("whole, phase 1 (resume_before_prepare)", resume_before_prepare, cfg)
    sharded = (ts / "optimizer_0").is_dir()
    if sharded:
        say("whole, phase 2 (resume_after_prepare)", "SKIP", "sharded checkpoint: see --sharded")
        return
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    policy, opt2 = objs["policy"], objs["optimizer"]
    if policy is None or opt2 is None:
        say("whole, phase 2 (resume_after_prepare)", "SKIP", "no LeRobot policy/optimizer")
        return
    policy, opt2 = accelerator.prepare(policy, opt2)
    run(
        "whole, phase 2 (resume_after_prepare)", resume_after_prepare, cfg, accelerator, policy, opt2, objs["scheduler"]
    )


def probe_sharded(step: Path) -> None:
    """main's FSDP2 resume channel: LeRobot's Accelerator builder, then load_sharded_model/optimizer."""
    if lerobot_flavor() != "main":
        say("sharded", "SKIP", "LeRobot 0.6.1 has no DCP resume channel")
        return
    pretrained, ts = step / "pretrained_model", step / "training_state"
    from lerobot.configs.accelerator import AcceleratorConfig, FSDPConfig
    from lerobot.configs.parallelism import ParallelismConfig
    from lerobot.distributed.checkpoint import load_sharded_model, load_sharded_optimizer
    from lerobot.distributed.factory import set_fsdp_wrap_modules
    from lerobot.optim import load_scheduler_state

    world = int(os.environ.get("WORLD_SIZE", "1"))
    objs = build_objects(step, "main") if RANK == 0 else None
    # every rank builds the same objects; only rank 0 printed the build lines above
    if RANK != 0:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            objs = build_objects(step, "main")
    par = ParallelismConfig(dp_shard=world)
    par.resolve(world)
    use_policy = objs["policy"] is not None
    acc_cfg = AcceleratorConfig(fsdp=FSDPConfig() if use_policy else FSDPConfig(min_num_params=1))
    accelerator = run(f"accelerator (AcceleratorConfig.build, dp_shard={world})", acc_cfg.build, par, cpu=True)
    if accelerator is None or objs["optimizer"] is None:
        say("sharded", "SKIP", "no accelerator/optimizer")
        return
    module = objs["module"]
    if use_policy:
        set_fsdp_wrap_modules(accelerator, module)
    prepared = run("accelerator.prepare(model, optimizer)", accelerator.prepare, module, objs["optimizer"])
    if not isinstance(prepared, (tuple, list)):
        return
    model, opt = prepared
    unwrapped = accelerator.unwrap_model(model)
    if (pretrained / "pytorch_model_fsdp_0").is_dir():
        run("pytorch_model_fsdp_0/ (load_sharded_model)", load_sharded_model, accelerator, unwrapped, pretrained)
    else:
        say("pytorch_model_fsdp_0/ (load_sharded_model)", "SKIP", "no DCP model dir")
    if (ts / "optimizer_0").is_dir():
        run("optimizer_0/ (load_sharded_optimizer)", load_sharded_optimizer, accelerator, opt, unwrapped, ts)
    else:
        say("optimizer_0/ (load_sharded_optimizer)", "SKIP", "no DCP optimizer dir")
    if (ts / "scheduler_state.json").is_file() and objs["scheduler"] is not None:
        run("scheduler_state.json (load_scheduler_state)", load_scheduler_state, objs["scheduler"], ts)
    cfg = objs["cfg"]
    if cfg is not None and use_policy:
        from lerobot.common.train_utils import resume_after_prepare

        cfg.resume = True
        cfg.checkpoint_path = step
        run(
            "whole, phase 2 (resume_after_prepare)",
            resume_after_prepare,
            cfg,
            accelerator,
            model,
            opt,
            objs["scheduler"],
        )
    else:
        say("whole, phase 2 (resume_after_prepare)", "SKIP", "train_config.json did not parse into a LeRobot policy")
    accelerator.wait_for_everyone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", type=Path, help="a checkpoint step dir (holding pretrained_model/ and training_state/)")
    parser.add_argument("--sharded", action="store_true", help="run main's DCP resume loaders (under torchrun)")
    args = parser.parse_args()
    step = args.step.resolve()
    if args.sharded:
        probe_sharded(step)
    else:
        probe(step)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
