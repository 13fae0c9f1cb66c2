"""What ``push --whole-step`` and ``--whole-run`` publish: checkpoints as the trainer wrote them.

A weights-only push (:func:`ckpt_tools.hub.files.plan_publish`) is what loads a policy. To
resume a run on another machine the whole step is needed - ``pretrained_model/`` with its DCP
shards, ``training_state/``, the record of the save's files - at the place the trainer and the
tools look for it: ``checkpoints/<step>/`` in the repo, so a download of the repo is a run
directory (:mod:`ckpt_tools.format.layout`). A whole run publishes every complete step and
``checkpoints/last``.

The Hub holds no symlinks, so ``last`` is published as a pointer file: a small regular file
named ``last`` holding the step directory's name (:func:`last_pointer`), the form
:func:`ckpt_tools.format.layout.resolve_last` reads besides the symlink the trainer writes.

A step is published only when it is one save's files: one whose record of its files
(:mod:`ckpt_tools.format.rules.save_files`) disagrees with what is on disk is refused, with
that rule's line, before any network traffic. Hidden files are left out (a conversion's
temporaries, a lock), except DCP's own ``.metadata`` and ``.metadata.index``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckpt_tools.errors import CheckpointError, UsageError
from ckpt_tools.facts import save_files
from ckpt_tools.format import layout
from ckpt_tools.hub.files import WHOLE_RUN, WHOLE_STEP, PublishFile, PublishPlan, checked_file

_DCP_HIDDEN = frozenset({layout.DCP_METADATA, layout.DCP_INDEX})


def last_pointer(step_name: str) -> bytes:
    """The bytes of the ``last`` pointer file: the name of the step directory it points at."""
    return step_name.encode("utf-8")


def repo_step_dir(step: layout.StepPaths) -> str:
    """Where a step is published in the repo: ``checkpoints/<step>``, as in a run directory."""
    return f"{layout.CHECKPOINTS_DIR}/{step.root.name}"


def plan_whole_step(path: str | os.PathLike[str]) -> PublishPlan:
    """Every file of the step ``path`` names (any path :func:`layout.resolve_step` accepts)."""
    step = _published_step(layout.resolve_step(path))
    files, skipped = _step_files(step)
    return PublishPlan(step.pretrained_model, tuple(files), tuple(skipped), _step_record(step), WHOLE_STEP)


def plan_whole_run(path: str | os.PathLike[str]) -> PublishPlan:
    """Every complete step of the run ``path`` names (its dir or its checkpoints root), and ``last``."""
    located = layout.locate(path)
    if located.kind is not layout.PathKind.CHECKPOINTS_ROOT or located.checkpoints_root is None:
        raise UsageError(
            f"{path}: --whole-run needs a run's output dir or its {layout.CHECKPOINTS_DIR}/ (this is a"
            f" {located.kind.value.replace('_', ' ')}; use --whole-step for one step)"
        )
    root = located.checkpoints_root
    last = layout.resolve_last(root)
    steps = layout.list_step_dirs(root)
    if last is None or last.name not in {s.name for s in steps}:
        raise CheckpointError(
            f"{root}: no usable '{layout.LAST_LINK}' (missing, dangling or not one of its steps); a run is"
            " published with the step it resumes from - publish single steps with --whole-step"
        )
    files: list[PublishFile] = []
    skipped = [p.name + "/" for p in layout.list_partial_dirs(root)]
    for step_dir in steps:
        step_files, step_skipped = _step_files(_published_step(layout.StepPaths(step_dir)))
        files += step_files
        skipped += step_skipped
    pointer = last_pointer(last.name)
    name = f"{layout.CHECKPOINTS_DIR}/{layout.LAST_LINK}"
    files.append(PublishFile(name, root / layout.LAST_LINK, len(pointer), model_file=False, data=pointer))
    newest = layout.StepPaths(last)
    return PublishPlan(newest.pretrained_model, tuple(files), tuple(skipped), _step_record(newest), WHOLE_RUN)


def _published_step(step: layout.StepPaths) -> layout.StepPaths:
    """``step`` if it can be published as a step of a run: named by its number, its files its save's."""
    if step.step is None:
        raise UsageError(
            f"{step.root}: not named by a step number (like 005000), so it has no place in a run's"
            f" {layout.CHECKPOINTS_DIR}/; publish its weights with a plain push instead"
        )
    if not step.pretrained_model.is_dir():
        raise CheckpointError(f"{step.root}: no {layout.PRETRAINED_MODEL_DIR}/, not a complete step")
    found = save_files.mismatch(step)
    if found is not None:
        raise CheckpointError(f"{found}; refusing to publish it")
    return step


def _step_files(step: layout.StepPaths) -> tuple[list[PublishFile], list[str]]:
    """The step's files as the trainer wrote them, at ``checkpoints/<step>/...``; and what is left out."""
    prefix = repo_step_dir(step)
    files: list[PublishFile] = []
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(step.root):
        here = Path(dirpath)
        rel_dir = here.relative_to(step.root)
        for d in dirnames:
            if (here / d).is_symlink():
                raise CheckpointError(f"{here / d}: a link to a directory; a published step holds only its own files")
        for d in [d for d in dirnames if d.startswith(".")]:
            skipped.append(f"{prefix}/{(rel_dir / d).as_posix()}/")
            dirnames.remove(d)
        dirnames.sort()
        for name in sorted(filenames):
            path = here / name
            rel = (rel_dir / name).as_posix()
            if name.startswith(".") and name not in _DCP_HIDDEN:
                skipped.append(f"{prefix}/{rel}")
                continue
            if path.is_symlink() or not path.is_file():
                raise CheckpointError(
                    f"{path}: not a regular file (a link?); a published step holds only its own files"
                )
            model_file = here == step.pretrained_model
            if name.endswith((".json", ".safetensors")):
                files.append(checked_file(path, f"{prefix}/{rel}", model_file=model_file))
            else:
                files.append(PublishFile(f"{prefix}/{rel}", path, path.stat().st_size, model_file=model_file))
    return files, skipped


def _step_record(step: layout.StepPaths) -> Path | None:
    return step.training_step if step.training_step.is_file() else None
