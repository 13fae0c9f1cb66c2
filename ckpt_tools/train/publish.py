"""End-of-training publishing: a collective finish, then the main rank uploads."""

from __future__ import annotations

from ckpt_tools import layout
from ckpt_tools.train.checkpoint import CheckpointManager
from ckpt_tools.train.config import TrainConfig
from ckpt_tools.train.distributed import DistEnv, barrier


def publish_final(cfg: TrainConfig, env: DistEnv, manager: CheckpointManager) -> None:
    """Upload ``last/pretrained_model`` to ``--policy.repo_id`` (main rank; all ranks wait)."""
    assert cfg.policy is not None and cfg.policy.repo_id
    barrier(env)
    if env.is_main:
        from ckpt_tools.hub import push_to_hub

        last = layout.resolve_last(manager.root)
        if last is None:
            from ckpt_tools.errors import CheckpointError

            raise CheckpointError("--policy.repo_id: no checkpoint to publish (was --save_checkpoint=false?)")
        result = push_to_hub(last / layout.PRETRAINED_MODEL_DIR, cfg.policy.repo_id, private=cfg.policy.private)
        print(f"published {last.name}/pretrained_model to {result.repo_url}", flush=True)
    barrier(env)
