"""Publishing to the Hugging Face Hub (docs/tools.md, ``push``): trained policies and whole checkpoints.

``push_to_hub`` uploads, by default, a model folder's top-level ``*.safetensors`` / ``*.json`` /
``*.md`` files (the weights alone: never DCP shards or training state); with
``scope=WHOLE_STEP`` / ``WHOLE_RUN`` a step as the trainer wrote it (or every step and
``last``) under ``checkpoints/``, so a download resumes. Local absolute paths are published as
copies without them. A generated model card is added; all of it in one commit.
``publish_checkpoint`` converts DCP shards first when needed, pushes, then deletes the shards
(``convert-dcp --push-to-hub`` and the trainer's ``--policy.repo_id`` both publish through it).
Nothing here imports ``huggingface_hub`` at module level, so CLI start-up stays fast.

    files.py       what a weights push publishes from a folder, checked before any network traffic
    whole_step.py  what --whole-step / --whole-run publish: checkpoints/<step>/..., last as a pointer file
    local_paths.py the published copies of files that hold local absolute paths
    card.py        the model card generated from train_config.json / training_step.json
    push.py        the huggingface_hub calls, the dry run, error translation (the Hub's failures vs. our own)
    client.py      the HTTP client of a push: a deadline per request, a cap per answer
    publish.py     convert -> verify -> push -> delete, for the CLI and the trainer alike
"""

from ckpt_tools.hub.card import build_model_card
from ckpt_tools.hub.files import (
    WEIGHTS,
    WHOLE_RUN,
    WHOLE_STEP,
    PublishFile,
    PublishPlan,
    plan_publish,
    resolve_publish_folder,
)
from ckpt_tools.hub.publish import PublishResult, publish_checkpoint
from ckpt_tools.hub.push import HubPushError, PushResult, UploadedFile, check_repo_id, push_to_hub

__all__ = [
    "WEIGHTS",
    "WHOLE_RUN",
    "WHOLE_STEP",
    "HubPushError",
    "PublishFile",
    "PublishPlan",
    "PublishResult",
    "PushResult",
    "UploadedFile",
    "build_model_card",
    "check_repo_id",
    "plan_publish",
    "publish_checkpoint",
    "push_to_hub",
    "resolve_publish_folder",
]
