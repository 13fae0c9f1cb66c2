"""The checkpoint step a Hub path names, downloaded so that ``ckpt-train`` resumes from it.

``ckpt-train --resume=true --config_path=hf://OWNER/REPO[@REV][/PATH]`` resumes on one machine
a run that another pushed. Which step is found as everywhere else: the repository is listed
once and :func:`ckpt_tools.format.layout.resolve_step` runs on that listing (a run's root
means its newest step; an upload leaves the ``last`` link out). Then only that step's files
are downloaded - ``snapshot_download`` with ``allow_patterns`` of the step, real bytes, into
the Hugging Face cache under the commit they came from - and every byte is checked against
the full digests the save recorded (:mod:`ckpt_tools.facts.save_data`) before the
trainer sees them. A folder that passed is marked, so the other ranks of the job, and a
later resume of the same commit, read it without downloading again; a folder that did not
pass is never marked, and the next attempt downloads again.

They are plain files, not the cache's symlinks into its blob store: the readers refuse a
checkpoint file that is a symlink out of its directory.
"""

from __future__ import annotations

from pathlib import Path

from ckpt_tools.errors import CheckpointError
from ckpt_tools.facts import save_data
from ckpt_tools.format import layout
from ckpt_tools.format.rules import save_files
from ckpt_tools.hub.location import HubLocation, parse_hub_path

VERIFIED = ".ckpt-tools-verified"  # in the download folder: the step under it passed the digests


def fetch_step(text: str) -> Path:
    """The local step directory of the step ``text`` (``hf://...``) names, downloaded and verified."""
    location = parse_hub_path(text)
    from ckpt_tools.hub.hubpath import HubPath
    from ckpt_tools.hub.push import _bounded_client, push_bounds  # the push's bounded client: one home
    from ckpt_tools.hub.remote import HubRepo

    with _bounded_client(push_bounds()):
        repo = HubRepo.open(location)
        step = layout.resolve_step(HubPath.of(repo))
    rel = step.root.in_repo  # type: ignore[attr-defined]
    commit = repo.commit or location.revision or "main"
    folder = download_folder(location, commit)
    local = folder / rel if rel else folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):  # the ranks of one job: one downloads, the others wait for it
        marker = folder / VERIFIED
        if marker.is_file() and marker.read_text() == rel:
            return local
        _download(location, commit, rel, folder)
        _verify(layout.StepPaths(local), location.child(rel))
        marker.write_text(rel)
    return local


def download_folder(location: HubLocation, commit: str) -> Path:
    """Where a commit's steps are downloaded: the Hugging Face cache, one folder per repo and commit."""
    from huggingface_hub import constants

    name = "ckpt-tools--" + location.repo_id.replace("/", "--")
    return Path(constants.HF_HUB_CACHE) / name / commit


def _download(location: HubLocation, commit: str, rel: str, folder: Path) -> None:
    from huggingface_hub import snapshot_download

    from ckpt_tools.hub.remote import hub_errors

    pattern = f"{rel}/*" if rel else "*"
    with hub_errors(location.child(rel), "downloading the step"):
        snapshot_download(location.repo_id, revision=commit, allow_patterns=[pattern], local_dir=folder)


def _verify(paths: layout.StepPaths, where: HubLocation) -> None:
    """Every downloaded byte against the save's full digests; a step without a record is refused."""
    saved = save_files.read(paths)
    if saved is None:
        raise CheckpointError(
            f"{where}: the step has no record of its save's files ({layout.SAVE_FILES}): a download cannot be"
            " verified, so it is not resumed"
        )
    verdict = save_data.verify(paths, saved)
    if verdict.problems or verdict.unverifiable:
        raise CheckpointError(f"{where}: the download is not what the save wrote ({verdict.summary(paths)})")
