"""End-of-training publishing: after the collective finish, the main rank uploads.

The upload runs once every rank has finished training and the process group is torn
down, so a slow or failing Hub can never leave other ranks blocked in a collective. A
``dcp``-only final checkpoint is converted first (torch-free, streamed, verified) so the
repo gets loadable safetensors, never DCP shards.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.errors import CheckpointError, HubError
from ckpt_tools.format import layout
from ckpt_tools.train.config import TrainConfig


def final_pretrained_model(cfg: TrainConfig) -> Path:
    last = layout.resolve_last(Path(str(cfg.output_dir)) / layout.CHECKPOINTS_DIR)
    if last is None:
        raise CheckpointError("--policy.repo_id: no checkpoint to publish (was --save_checkpoint=false?)")
    return last / layout.PRETRAINED_MODEL_DIR


def publish_final(cfg: TrainConfig) -> str:
    """Main rank only, after teardown. Returns the repo URL; raises CkptError with a retry hint."""
    assert cfg.policy is not None and cfg.policy.repo_id
    folder = final_pretrained_model(cfg)
    has_weights = (folder / layout.MODEL_WEIGHTS).exists() or (folder / layout.ADAPTER_WEIGHTS).exists()
    if not has_weights and (folder / layout.MODEL_DCP_DIR).is_dir():
        from ckpt_tools.convert import convert_dcp

        convert_dcp(folder, progress=False, verify=True)
    from ckpt_tools.hub import push_to_hub

    try:
        result = push_to_hub(folder, cfg.policy.repo_id, private=cfg.policy.private)
    except HubError as e:
        raise HubError(f"{e} - retry with: ckpt-tools push {folder} --repo-id {cfg.policy.repo_id}") from None
    return result.repo_url
