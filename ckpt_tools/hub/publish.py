"""Publish a checkpoint: convert its DCP shards if needed, push, and only then delete the shards.

``convert-dcp --push-to-hub`` and the trainer's end-of-training ``--policy.repo_id`` publish
the same way, through :func:`publish_checkpoint`:

1. the repo id is checked before any work, so a typo never costs a conversion;
2. the weights are converted to safetensors - always when asked (``convert=ConvertOptions(...)``), otherwise
   only when the step holds them as DCP shards alone - and every written byte is read back
   and compared with the shards before the output is committed; an output already there that
   verifies as this conversion's (the same command, run again after a failed push) is kept,
   so the retry a failed push promises is the same command;
3. the folder is pushed (:func:`~ckpt_tools.hub.push.push_to_hub`: never DCP shards, never
   ``training_state/``);
4. with ``delete_dcp``, the converted shards are removed - after the upload succeeded, so a
   failed push leaves the checkpoint exactly as it was plus the verified safetensors.

A push that fails after a conversion says so: its line names the files the conversion wrote
(or kept) and that the shards were kept - never "no local file was changed", which is only
true of the push itself. The caller adds the command that retries the push alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_tools.format import layout
from ckpt_tools.hub.files import resolve_publish_folder
from ckpt_tools.hub.push import HubPushError, PushResult, check_repo_id, push_to_hub

if TYPE_CHECKING:
    from ckpt_tools.convert import ConvertOptions, ConvertResult

CONVERTED_MESSAGE = "Upload converted checkpoint with ckpt-tools"


@dataclass(frozen=True)
class PublishResult:
    conversion: ConvertResult | None  # None: the weights were already safetensors
    push: PushResult

    def to_dict(self) -> dict[str, Any]:
        return {"conversion": self.conversion.to_dict() if self.conversion else None, "hub": self.push.to_dict()}


def publish_checkpoint(
    checkpoint: str | os.PathLike[str],
    repo_id: str,
    *,
    private: bool = False,
    convert: ConvertOptions | None = None,
    delete_dcp: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    repo_id_flag: str = "--repo-id",
    progress: bool = True,
) -> PublishResult:
    """Publish ``checkpoint`` (any path :func:`~ckpt_tools.format.layout.resolve_step` accepts,
    or a folder of converted files) as the Hub model repo ``repo_id``.

    ``convert``: the :class:`~ckpt_tools.convert.options.ConvertOptions` to convert the DCP
    shards with first (always verified; the conversion's output folder is pushed; its
    ``delete_dcp`` waits for the push, as ``delete_dcp`` does); None converts, as the options'
    defaults say, only a ``pretrained_model/`` whose weights exist as DCP shards alone.
    ``delete_dcp`` removes the converted shards after the push succeeded. ``progress``: False
    hides the conversion's progress bar. ``repo_id_flag`` names the option in the message for a
    malformed repo id. Raises :class:`~ckpt_tools.errors.CkptError` only; nothing is deleted
    unless the push succeeded.
    """
    check_repo_id(repo_id, flag=repo_id_flag)
    from ckpt_tools.convert import ConvertOptions, convert_dcp, delete_converted_dcp

    conversion = None
    folder = None if convert is not None else resolve_publish_folder(checkpoint)
    options = convert
    if options is None and folder is not None and _dcp_only(folder):
        options = ConvertOptions()  # a dcp-format save: the weights exist only as shards
    if options is not None:
        source = checkpoint if convert is not None else folder
        assert source is not None
        delete_dcp = delete_dcp or options.delete_dcp  # after the push, never before
        conversion = convert_dcp(
            source, options.but(verify=True, delete_dcp=False, progress=progress and options.progress)
        )
        folder = conversion.plan.output_dir
    assert folder is not None
    message = commit_message or (CONVERTED_MESSAGE if conversion is not None else None)
    try:
        pushed = push_to_hub(folder, repo_id, private=private, revision=revision, commit_message=message, token=token)
    except HubPushError as e:
        if conversion is None:
            raise
        raise e.but(local=converted_state(conversion)) from None
    if delete_dcp and conversion is not None:
        conversion = delete_converted_dcp(conversion)
    return PublishResult(conversion, pushed)


def converted_state(conversion: ConvertResult) -> str:
    """What a conversion left on disk, for the line of the push that failed after it."""
    files = conversion.output_files
    kept = any(note.startswith("kept the existing") for note in conversion.notes)
    named = str(files[0]) if len(files) == 1 else f"{len(files)} files in {conversion.plan.output_dir}"
    done = f"verified the existing {named} (kept)" if kept else f"wrote and verified {named}"
    return f"{done}; the DCP shards were kept"


def _dcp_only(folder: Path) -> bool:
    """A ``pretrained_model/`` holding its weights only as DCP shards (a ``dcp``-format save)."""
    gathered = (layout.MODEL_WEIGHTS, layout.MODEL_WEIGHTS_INDEX, layout.ADAPTER_WEIGHTS)
    return not any((folder / name).exists() for name in gathered) and (folder / layout.MODEL_DCP_DIR).is_dir()
