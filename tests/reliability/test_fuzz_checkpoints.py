"""Hostile and broken checkpoints for every reader: fuzzed, fenced, judged (docs/reliability.md).

Seeds are real checkpoints (the session's DDP / FSDP / HSDP runs and the golden 0.6.x one);
each case copies one, damages it (truncations, bit flips, swapped files, memory bombs,
nesting bombs, pickles that reach for any callable, symlinks, FIFOs, ``..`` paths, JSON of
the wrong types - see ``devtools/reliability/fuzz_mutations.py``) and runs every reader on it. The
rules each case must keep are in ``devtools/reliability/fuzz_runner.py``.

CI runs fifty derandomized cases (and one of each family the draw missed) through the Python API (``CKPT_FUZZ_EXAMPLES``
overrides the count), a sample through the real CLI without torch importable, and a few
through the training core's own resume; ``bin/reliability-report`` runs thousands.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.reliability import fuzz_mutations as M
from devtools.reliability import fuzz_payloads as P
from devtools.reliability.fuzz_campaign import campaign, examples_from_env
from devtools.reliability.fuzz_runner import CaseResult, Seed, make_seed, run_case, run_cli_case, run_train_case
from devtools.training import LEGACY_CHECKPOINT, step_dir


@pytest.fixture(scope="module")
def seeds(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[Seed]:
    scratch = tmp_path_factory.mktemp("fuzz-seeds")
    out = [make_seed(name, step_dir(runs[name], 4), scratch) for name in ("fsdp", "hsdp", "ddp")]
    return [*out, make_seed("legacy", LEGACY_CHECKPOINT, scratch)]


def _assert_clean(result: CaseResult) -> None:
    assert result.ok, f"{result.seed} {result.family} ({result.target}): {result.detail}\n" + "\n".join(
        result.violations
    )


def test_every_reader_survives_fuzzed_checkpoints(seeds: list[Seed], tmp_path: Path) -> None:
    seen: list[CaseResult] = []

    def check(result: CaseResult) -> None:
        seen.append(result)
        _assert_clean(result)

    campaign(seeds, examples_from_env(50), tmp_path, check)
    # A family the draw missed (or that fell back to another on a seed without DCP) gets one
    # case on the FSDP seed, so every way of damaging a checkpoint is tried on every run.
    for family in sorted(set(M.FAMILIES) - {r.family for r in seen}):
        check(run_case(seeds[0], family, 0, tmp_path))
    # The campaign really damaged checkpoints in every way, and the readers really refused some.
    assert {r.family for r in seen} == set(M.FAMILIES)
    assert sum(s == "error" for r in seen for s in r.statuses().values()) > len(seen)


METADATA_FAMILIES = (
    "bitflip_metadata",
    "metadata_bomb",
    "metadata_work_bomb",
    "deep_pickle",
    "callable_pickle",
    "build_pickle",
    "damaged_index",
)


@pytest.mark.parametrize("family", METADATA_FAMILIES)
def test_the_isolated_metadata_reader_survives_the_metadata_families(
    seeds: list[Seed], tmp_path: Path, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``.metadata`` through C's unpickler in the worker (large files' engine), whatever its size."""
    from ckpt_tools.dcp.metadata import ENGINE_ENV

    monkeypatch.setenv(ENGINE_ENV, "isolated")
    for rng_seed in (1, 2):
        _assert_clean(run_case(seeds[0], family, rng_seed, tmp_path))


def _callable_in_metadata(arena: M.Arena, rng: object) -> M.Mutation:
    payload = P.CallablePayload("posix:system", "global").build(str(arena.sentinel))
    (arena.step / M.MODEL_DCP / ".metadata").write_bytes(payload)
    return M.Mutation("callable_pickle", "model .metadata := posix.system(touch sentinel)", [M.MODEL_DCP])


def _json_nesting_bomb(arena: M.Arena, rng: object) -> M.Mutation:
    (arena.step / "training_state/training_step.json").write_text(P.json_nesting_bomb(100_000))
    return M.Mutation("json_wrong_types", "training_step.json := 100k-deep nesting", ["training_state"])


def _fifo_metadata(arena: M.Arena, rng: object) -> M.Mutation:
    import os

    meta = arena.step / M.OPTIMIZER_DCP / ".metadata"
    meta.unlink()
    os.mkfifo(meta)
    return M.Mutation("hostile_paths", "optimizer .metadata is a FIFO", [M.OPTIMIZER_DCP])


CLI_CASES = {
    "pickle calling posix.system in .metadata": ("fsdp", _callable_in_metadata, 1),
    "100k-deep JSON": ("hsdp", _json_nesting_bomb, 2),
    "FIFO as .metadata": ("fsdp", _fifo_metadata, 3),
    "random hostile path": ("hsdp", "hostile_paths", 11),
    "random metadata bomb": ("fsdp", "metadata_bomb", 12),
}


@pytest.mark.parametrize("name", sorted(CLI_CASES))
def test_cli_gives_one_error_line_and_a_documented_code(seeds: list[Seed], tmp_path: Path, name: str) -> None:
    seed_name, family, rng_seed = CLI_CASES[name]
    seed = next(s for s in seeds if s.name == seed_name)
    _assert_clean(run_cli_case(seed, family, rng_seed, tmp_path))


def _config_json_nesting_bomb(arena: M.Arena, rng: object) -> M.Mutation:
    (arena.step / "pretrained_model/config.json").write_text(P.json_nesting_bomb(100_000))
    return M.Mutation("json_wrong_types", "config.json := 100k-deep nesting", ["pretrained_model/config.json"])


@pytest.mark.parametrize("rng_seed, form", [(0, "pretrained_model"), (1, "step"), (2, "root")])
def test_cli_push_refuses_a_nesting_bomb_before_the_network(
    seeds: list[Seed], tmp_path: Path, rng_seed: int, form: str
) -> None:
    seed = next(s for s in seeds if s.name == "ddp")  # gathered model.safetensors: publishable but for the bomb
    # push alone: the other commands on 100k-deep JSON are test_cli_gives_one_error_line_and_a_documented_code's.
    result = run_cli_case(seed, _config_json_nesting_bomb, rng_seed, tmp_path, commands=("push",))
    _assert_clean(result)
    assert result.target == f"cli:{form}" and list(result.readers) == ["push --repo-id"]
    assert result.readers["push --repo-id"]["code"] == 3  # not 5: it never got as far as the (offline) Hub


def _truncated_shard(arena: M.Arena, rng: object) -> M.Mutation:
    import os

    shard = arena.step / M.MODEL_DCP / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)
    return M.Mutation("truncate", "model shard __1_0 cut in half", [M.MODEL_DCP])


def _byte_item_payload(arena: M.Arena, rng: object) -> M.Mutation:
    import random

    payload = P.CallablePayload("os:system", "global").build(str(arena.sentinel))
    return M._place_pickle(arena, M.OPTIMIZER_DCP, "byte_item", payload, "callable_pickle", random.Random(0))


def _train_config_huge_int(arena: M.Arena, rng: object) -> M.Mutation:
    path = arena.step / "pretrained_model/train_config.json"
    path.write_text(path.read_text().replace('"seed": ', '"seed": ' + "9" * 5000 + ', "x": ', 1))
    return M.Mutation("json_wrong_types", "train_config.json seed with 5000 digits", ["pretrained_model"])


TRAIN_CASES = [
    pytest.param("fsdp", _truncated_shard, id="truncated-shard"),
    pytest.param("fsdp", _callable_in_metadata, id="metadata-pickle-runs-code"),
    pytest.param("fsdp", _byte_item_payload, id="byte-item-pickle-runs-code"),
    pytest.param("ddp", _train_config_huge_int, id="train-config-huge-int"),
]


@pytest.mark.parametrize(("seed_name", "mutate"), TRAIN_CASES)
def test_training_core_resume_refuses_cleanly_and_runs_nothing(
    seeds: list[Seed], tmp_path: Path, seed_name: str, mutate: M.Family
) -> None:
    seed = next(s for s in seeds if s.name == seed_name)
    result = run_train_case(seed, mutate, 7, tmp_path, timeout=120)
    _assert_clean(result)
    assert result.readers["train"]["code"] != 0
