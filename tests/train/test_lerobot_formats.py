"""ckpt-train's training_state/ files have the structure of the files LeRobot main writes.

LeRobot's readers (``load_rng_state``, ``load_optimizer_state``, ``load_scheduler_state``,
``load_training_metadata``) pick keys by name and, for JSON, fill the live object strictly (same
keys, same primitive types: ``deserialize_json_into_object``). CI has no LeRobot, so these tests
compare what the ``runs`` fixture wrote with the files LeRobot main wrote in fixtures/lerobot/main;
the probe (``bin/make-lerobot-fixtures probe``) runs LeRobot's own readers on a ckpt-train checkpoint
(docs/checkpoint-format.md has its output).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ckpt_tools.dcp.metadata import load_metadata
from ckpt_tools.format import lerobot
from ckpt_tools.format.param_groups import PARAM_NAMES_KEY
from ckpt_tools.format.rules import save_stamps
from ckpt_tools.st.header import read_header
from devtools.training import step_dir, unstamped_json
from tests.support.lerobot_fixtures import main_run

LEROBOT_POSITION_KEY = re.compile(r"^state/(0|[1-9][0-9]*)/[A-Za-z_]+$")


def lerobot_state(run: str) -> Path:
    return main_run(run) / "checkpoints/000004/training_state"


def ours(runs: dict[str, Path], run: str) -> Path:
    return step_dir(runs[run], 4) / "training_state"


def skeleton(value: Any) -> Any:
    """What ``deserialize_json_into_object`` checks: dict keys, and the primitive type at every leaf."""
    if isinstance(value, dict):
        return {k: skeleton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [skeleton(v) for v in value[:1]]  # element types (group counts differ by policy)
    return type(value).__name__


def test_rng_state_has_lerobot_mains_keys_dtypes_and_shapes(runs: dict[str, Path]) -> None:
    theirs = read_header(lerobot_state("single") / "rng_state.safetensors").entries
    mine = read_header(ours(runs, "ddp") / "rng_state.safetensors").entries
    assert set(lerobot.RNG_KEYS) == set(theirs)  # the fixture is what the constant says
    for key, entry in theirs.items():
        assert (mine[key].dtype, mine[key].shape) == (entry.dtype, entry.shape), key
    # Ours beyond LeRobot's: every rank's own state, under names LeRobot's py/np/torch prefixes
    # and its "/"-unflattening never pick up.
    extra = set(mine) - set(theirs)
    assert extra == {"rank0.torch", "rank1.torch"}
    assert not any(k.startswith(("py", "np", "torch")) or "/" in k for k in extra)


def test_optimizer_files_are_lerobot_mains_form(runs: dict[str, Path]) -> None:
    theirs_ts, mine_ts = lerobot_state("single-cosine"), ours(runs, "ddp")
    header = read_header(mine_ts / "optimizer_state.safetensors")
    assert header.entries and all(LEROBOT_POSITION_KEY.match(k) for k in header.entries)
    theirs_slots = {
        k.rsplit("/", 1)[1]: e.dtype for k, e in read_header(theirs_ts / "optimizer_state.safetensors").entries.items()
    }
    assert {k.rsplit("/", 1)[1]: e.dtype for k, e in header.entries.items()} == theirs_slots
    names = json.loads(header.metadata[PARAM_NAMES_KEY])  # ours, where LeRobot's load_file never looks

    groups = json.loads((mine_ts / "optimizer_param_groups.json").read_text())
    theirs_groups = json.loads((theirs_ts / "optimizer_param_groups.json").read_text())
    assert isinstance(groups, list)
    assert [p for g in groups for p in g["params"]] == list(range(len(names)))  # torch's numbering
    positions = {int(k.split("/")[1]) for k in header.entries}
    assert positions <= set(range(len(names)))
    for group in groups:  # exactly torch's keys, with LeRobot's JSON types: its strict reader takes them
        assert skeleton(group) == skeleton(theirs_groups[0])


def test_scheduler_state_has_lerobot_mains_structure(runs: dict[str, Path]) -> None:
    theirs = json.loads((lerobot_state("single-cosine") / "scheduler_state.json").read_text())
    mine = json.loads((ours(runs, "ddp") / "scheduler_state.json").read_text())
    # both LambdaLR.state_dict(), ours stamped with its save's id (LambdaLR.load_state_dict keeps it as an attribute)
    assert set(mine) - set(theirs) == {save_stamps.KEY}
    assert skeleton(unstamped_json(ours(runs, "ddp") / "scheduler_state.json")) == skeleton(theirs)


def test_training_step_is_a_superset_of_lerobot_mains(runs: dict[str, Path]) -> None:
    theirs = json.loads((lerobot_state("single") / "training_step.json").read_text())
    for run in ("ddp", "fsdp", "hsdp"):
        mine = json.loads((ours(runs, run) / "training_step.json").read_text())
        assert {k: skeleton(mine[k]) for k in theirs} == skeleton(theirs), run
        topology = mine["topology"]
        assert mine["parallelism"] == {
            "dp_replicate": topology["dp_replicate"],
            "dp_shard": topology["dp_shard"],
            "ring_degree": 1,
            "ulysses_degree": 1,
        }


@pytest.mark.parametrize("run", ["fsdp", "hsdp"])
def test_sharded_optimizer_state_is_laid_out_as_lerobot_mains(runs: dict[str, Path], run: str) -> None:
    """Both write get_optimizer_state_dict under "optimizer": state by parameter name, param groups by index."""

    def fields(directory: Path) -> tuple[set[str], set[str]]:
        items = load_metadata(directory).item_names
        assert all(k.startswith(("optimizer.state.", "optimizer.param_groups.")) for k in items)
        slots = {k.rsplit(".", 1)[1] for k in items if k.startswith("optimizer.state.")}
        group_fields = {k.split(".", 3)[3] for k in items if k.startswith("optimizer.param_groups.0.")}
        return slots, group_fields

    theirs_slots, theirs_groups = fields(lerobot_state("fsdp-dcp") / "optimizer_0")
    mine_slots, mine_groups = fields(ours(runs, run) / "optimizer_0")
    assert mine_slots == theirs_slots
    assert mine_groups - {"initial_lr"} == theirs_groups  # initial_lr: ckpt-train's LR scheduler
