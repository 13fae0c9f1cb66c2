"""End-of-training publishing: after the collective finish, the main rank uploads.

The upload runs once every rank has finished training and the process group is torn
down, so a slow or failing Hub can never leave other ranks blocked in a collective. The
work is :func:`ckpt_tools.hub.publish_checkpoint`'s, as for ``convert-dcp --push-to-hub``:
a ``dcp``-only final checkpoint is converted first (torch-free, streamed, verified) so the
repo gets loadable safetensors, never DCP shards.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.errors import CheckpointError, HubError
from ckpt_tools.format import layout
from ckpt_tools.train.config import TrainConfig


def publish_final(cfg: TrainConfig) -> str:
    """Main rank only, after teardown. Returns the repo URL; raises CkptError with a retry hint."""
    from ckpt_tools.hub import publish_checkpoint

    assert cfg.policy is not None and cfg.policy.repo_id
    try:
        folder = layout.resolve_step(Path(str(cfg.output_dir)) / layout.CHECKPOINTS_DIR).pretrained_model
    except CheckpointError as e:
        raise CheckpointError(
            f"--policy.repo_id: no checkpoint to publish ({e}; was --save_checkpoint=false?)"
        ) from None
    try:
        result = publish_checkpoint(
            folder, cfg.policy.repo_id, private=cfg.policy.private, repo_id_flag="--policy.repo_id", progress=False
        )
    except HubError as e:
        retry = f"ckpt-tools push {folder} --repo-id {cfg.policy.repo_id}{' --private' if cfg.policy.private else ''}"
        raise HubError(f"{e} - retry with: {retry}") from None
    return result.push.repo_url
