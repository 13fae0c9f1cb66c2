"""Device patches bin/make-lerobot-fixtures applies to sharded LeRobot runs: FSDP on CPU + gloo.

Placed first on ``PYTHONPATH`` by the fixture script (Python imports ``sitecustomize`` at
start-up) and active only when ``LEROBOT_FIXTURES_CPU_FSDP=1``. Each patch is installed right after
its module executes (an import hook; nothing is imported early) and prints
``[lerobot-fixtures cpu patch] installed: ...`` on stderr, then ``... used: ...`` the first time
it changes anything in a process, so every run log shows which patches acted.
No LeRobot code is patched. There are two kinds of patch:

1. accelerate's device check (``accelerate.state.AcceleratorState.__init__``). accelerate selects
   ``DistributedType.FSDP`` only for a GPU-like process group (``MULTI_GPU``, ``MULTI_XPU``, ...);
   on a CPU-only machine a torchrun launch is ``MULTI_CPU`` (gloo) and accelerate silently drops
   the FSDP plugin and wraps the model in DDP, so LeRobot would write a DDP checkpoint while
   believing it ran FSDP. After ``__init__``, if the state is ``MULTI_CPU`` and an FSDP plugin was
   handed in (LeRobot main passes one; 0.6.1's ``accelerate launch --config_file`` flow makes
   ``Accelerator`` build one from ``ACCELERATE_USE_FSDP=true``), it makes the two assignments
   accelerate's GPU branch makes (``distributed_type = FSDP``, ``fsdp_plugin``) and names the
   device ``cpu`` instead of MULTI_CPU's ``cpu:0`` (torch's FSDP1 refuses a ``device_id`` of
   ``cpu:0`` beside the ``cpu`` compute device it derives). The process group stays gloo.

2. torch's "offload to CPU" steps when the compute device already is the CPU. Three gathers that
   LeRobot asks to offload to CPU assume the tensors live on an accelerator, where offloading is a
   fresh host copy; on CPU the "copy" is the very tensor, which is then freed (SIGSEGV) or stays a
   view into a shared all-gather buffer (safetensors refuses to write it). Each patch makes the CPU
   case produce what the GPU case produces - a separate CPU tensor - and changes nothing else:
   ``FlatParamHandle.to_cpu`` (FSDP1 model ``FULL_STATE_DICT``, 0.6.1), ``_unflatten_orig_param_states``
   (FSDP1 full optimizer state dict, 0.6.1) and ``_maybe_full_or_cpu_state_dict`` (the DCP
   state-dict API's full gather behind main's ``model.safetensors`` of a sharded run).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_USED: set[str] = set()


def _report(what: str, used: bool = False) -> None:
    """One stderr line when a patch is installed, and one the first time it changes anything."""
    if used:
        if what in _USED:
            return
        _USED.add(what)
    print(f"[lerobot-fixtures cpu patch] {'used' if used else 'installed'}: {what}", file=sys.stderr, flush=True)


def _patch(state_module: object) -> None:
    import torch
    from accelerate.utils import DistributedType

    cls = state_module.AcceleratorState
    original_init = cls.__init__

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # ``Accelerator`` passes the plugin it was given, or the one it built from ``ACCELERATE_USE_FSDP``.
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            # MULTI_CPU names its device ``cpu:0``; torch's FSDP compares ``device_id`` with the CPU
            # device it derives itself (``cpu``) and refuses the mismatch. The index means nothing on CPU.
            self.device = torch.device("cpu")
            shared = state_module.PartialState._shared_state
            shared["distributed_type"] = self.distributed_type
            shared["device"] = self.device
            _report(
                f"accelerate MULTI_CPU -> FSDP (fsdp_version={fsdp_plugin.fsdp_version}, backend={self.backend})", True
            )

    cls.__init__ = __init__
    _report("accelerate AcceleratorState: MULTI_CPU + FSDP plugin -> FSDP, device cpu")


def _patch_flat_param(flat_param_module: object) -> None:
    """torch FSDP1: ``offload_to_cpu`` on a CPU run must not free the tensors it hands back.

    ``FlatParamHandle.to_cpu`` (entered by ``FULL_STATE_DICT`` with ``offload_to_cpu=True``, as
    LeRobot 0.6.1's ``gather_fsdp_state_dicts`` asks) moves the gathered flat parameter to CPU and
    frees the compute-device copy. When the compute device *is* the CPU the move is a no-op, so it
    frees the very storage the state dict is about to clone, and rank 0 dies with SIGSEGV. On CPU
    the context is made a no-op: the gathered tensors already are where offloading would put them.
    """
    import contextlib

    cls = flat_param_module.FlatParamHandle
    original_to_cpu = cls.to_cpu

    @contextlib.contextmanager
    def to_cpu(self):
        if self.device.type == "cpu":
            _report("torch FSDP1 FlatParamHandle.to_cpu skipped (already on CPU)", True)
            yield
            return
        with original_to_cpu(self):
            yield

    cls.to_cpu = to_cpu
    _report("torch FSDP1 FlatParamHandle.to_cpu: no-op on CPU")


def _patch_optim_utils(optim_utils_module: object) -> None:
    """torch FSDP1: a CPU run's offloaded optimizer state must be copies, as it is on GPUs.

    ``_unflatten_orig_param_states`` skips its ``clone()`` under ``cpu_offload`` because the
    following ``.cpu()`` copies device memory to the host. On CPU ``.cpu()`` returns the tensor
    itself, so the gathered states stay views into one all-gather buffer and safetensors refuses
    to write them ("Some tensors share memory"). On CPU the function runs with
    ``cpu_offload=False``, which clones - the copy the GPU path makes with ``.cpu()``.
    """
    original = optim_utils_module._unflatten_orig_param_states

    def _unflatten_orig_param_states(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload):
        if cpu_offload and fsdp_param_info.handle.device.type == "cpu":
            _report("torch FSDP1 _unflatten_orig_param_states cloned (already on CPU)", True)
            cpu_offload = False
        return original(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload)

    optim_utils_module._unflatten_orig_param_states = _unflatten_orig_param_states
    _report("torch FSDP1 _unflatten_orig_param_states: clone instead of .cpu() on CPU")


def _patch_dcp_state_dict(state_dict_module: object) -> None:
    """torch DCP state-dict API: a CPU run's ``full_state_dict + cpu_offload`` gather must own its memory.

    ``get_model_state_dict(..., full_state_dict=True, cpu_offload=True)`` (LeRobot main's
    ``full_model_state_dict``, the gather behind ``model.safetensors`` of a sharded run) all-gathers
    each DTensor and then offloads it with ``.to("cpu")``: on GPUs a fresh copy of exactly that
    tensor. On CPU it is the gathered tensor itself, and for an unevenly sharded parameter that is a
    narrowed view of the padded all-gather buffer, which huggingface_hub's safetensors writer
    refuses ("None is covering the entire storage"). On CPU each offloaded tensor is cloned - the
    copy the GPU path makes.
    """
    import torch

    original = state_dict_module._maybe_full_or_cpu_state_dict

    def all_cpu(obj) -> bool:
        if isinstance(obj, dict):
            return all(all_cpu(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return all(all_cpu(v) for v in obj)
        if isinstance(obj, torch.Tensor):
            mesh = getattr(obj, "device_mesh", None)
            return (mesh.device_type if mesh is not None else obj.device.type) == "cpu"
        return True

    def cloned(obj):
        if isinstance(obj, dict):
            return {k: cloned(v) for k, v in obj.items()}
        if isinstance(obj, torch.Tensor):
            return obj.clone()
        return obj

    def _maybe_full_or_cpu_state_dict(state_dict, info):
        on_cpu = info.cpu_offload and all_cpu(state_dict)
        out = original(state_dict, info)
        if not on_cpu:
            return out
        _report("torch DCP _maybe_full_or_cpu_state_dict cloned the offloaded tensors (already on CPU)", True)
        return cloned(out)

    state_dict_module._maybe_full_or_cpu_state_dict = _maybe_full_or_cpu_state_dict
    _report("torch DCP _maybe_full_or_cpu_state_dict: clone offloaded tensors on CPU")


_PATCHES = {
    "torch.distributed.checkpoint.state_dict": _patch_dcp_state_dict,
    "accelerate.state": _patch,
    "torch.distributed.fsdp._flat_param": _patch_flat_param,
    "torch.distributed.fsdp._optim_utils": _patch_optim_utils,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs the module's patch right after it executes, without importing anything early."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES or name in _DONE:
            return None
        _DONE.add(name)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


_DONE: set[str] = set()

if os.environ.get("LEROBOT_FIXTURES_CPU_FSDP") == "1":
    sys.meta_path.insert(0, _PatchOnImport())
