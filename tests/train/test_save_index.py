"""Every DCP directory the training core saves carries its chunk index, and every tool uses it.

On the session's real FSDP and HSDP runs: each step's ``pretrained_model/pytorch_model_fsdp_0``
and ``training_state/optimizer_0`` hold ``.metadata.index``, bound to their ``.metadata``, with
the shard files stamped as the save wrote them; ``inspect``, ``verify-resume``, ``reshard-plan``
and ``convert-dcp --dry-run`` read it, and answer exactly as they do with ``--no-cache``
(``.metadata`` parsed and every chunk archive read afresh).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_tools.dcp.index import ChunkIndex, forget
from ckpt_tools.dcp.metadata import load_metadata
from ckpt_tools.dcp.sources import reading
from ckpt_tools.format import layout as L
from devtools.training import step_dir
from tests.support.cli import invoke_cli
from tests.support.tables import table_differences

DCP_DIRS = (f"{L.PRETRAINED_MODEL_DIR}/{L.MODEL_DCP_DIR}", f"{L.TRAINING_STATE_DIR}/{L.OPTIMIZER_DCP_DIR}")


@pytest.mark.parametrize("run", ["fsdp", "hsdp"])
def test_every_save_writes_an_index_bound_to_its_metadata(runs: dict[str, Path], run: str) -> None:
    steps = sorted(p for p in (runs[run] / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) >= 2
    for step in steps:
        for rel in DCP_DIRS:
            directory = step / rel
            assert (directory / L.DCP_INDEX).is_file(), directory
            forget()
            index = ChunkIndex.load(directory)
            assert index.origin.source == "index" and index.origin.note is None, index.origin
            assert index.archives_known_good()
            with reading(index=False, cache=False):
                assert table_differences(index.table, load_metadata(directory)) == []


def _answer(*args: str) -> dict[str, Any]:
    forget()
    proc = invoke_cli(*args, "--json")
    doc = json.loads(proc.stdout)
    doc.pop("seconds", None)
    doc.pop("notes", None)  # where the chunk table came from, said in a note
    for step in doc.get("steps", []):
        step.pop("notes", None)
    return {"exit": proc.returncode, "doc": doc}


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "{step}"),
        ("verify-resume", "{step}"),
        ("verify-resume", "{step}", "--nproc", "2", "--dp-replicate", "1", "--dp-shard", "2", "--batch-size", "8"),
        ("reshard-plan", "{step}", "--nproc", "4", "--dp-replicate", "2", "--dp-shard", "2"),
        ("convert-dcp", "{step}", "--dry-run"),
    ],
    ids=["inspect", "verify-resume", "verify-resume onto FSDP(2)", "reshard-plan onto HSDP", "convert-dry-run"],
)
def test_the_tools_answer_the_same_with_and_without_the_index(runs: dict[str, Path], args: tuple[str, ...]) -> None:
    step = str(step_dir(runs["hsdp"], 8))  # the run's last: a resume of step 4 would overwrite 000008
    command = [a.format(step=step) for a in args]
    with_index = _answer(*command)
    without = _answer(*command, "--no-cache")
    assert with_index == without
    assert with_index["exit"] == 0, with_index
