"""The isolated engine: C's unpickler in a resource-capped worker, for large ``.metadata``.

Every hostile payload the restricted unpickler is tested with goes through the worker too:
each is refused in one line, nothing in this process changes, and work that grows faster than
the file (a hash bomb C's unpickler cannot be stopped in) ends at the worker's CPU limit. On
real files both engines give the same table.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_tools.dcp import isolated, metadata
from ckpt_tools.dcp.metadata import ENGINE_ENV, parse_metadata_file
from ckpt_tools.errors import CkptError
from devtools.reliability import fuzz_payloads as P
from devtools.reliability.process_state import changes, fingerprint
from tests.support.dcp_fixtures import FSDP2_DCP, FSDP2_OPT
from tests.support.tables import table_differences

pytestmark = pytest.mark.skipif(not isolated.available(), reason="no resource limits on this platform")


def parse_with(engine: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(ENGINE_ENV, engine)
    return parse_metadata_file(path)


def outcome(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Parse ``path`` in the isolated engine: how it ended, how long it took, what changed here."""
    monkeypatch.setenv(ENGINE_ENV, "isolated")
    before = fingerprint()
    start = time.monotonic()
    error = message = None
    try:
        parse_metadata_file(path)
    except CkptError as e:
        error, message = type(e).__name__, str(e)
    return {
        "error": error,
        "message": message,
        "seconds": time.monotonic() - start,
        "changed": changes(before, fingerprint()),
    }


def assert_one_line(message: str | None) -> None:
    assert message and "\n" not in message and len(message) < 400, message


@pytest.mark.parametrize("directory", [FSDP2_DCP, FSDP2_OPT])
def test_both_engines_give_the_same_table(ckpts: Path, directory: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ckpts / directory / ".metadata"
    inside = parse_with("in-process", path, monkeypatch)
    worker = parse_with("isolated", path, monkeypatch)
    assert table_differences(inside, worker) == []
    assert inside.rows > 0


def test_a_torch_save_with_thousands_of_chunks_reads_the_same_in_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the size limit of the in-process engine: auto picks the worker, and agrees with it."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    directory = tmp_path / "dcp"
    dcp.save({"model": {f"w{i}": torch.zeros(2) for i in range(8)}}, checkpoint_id=directory, no_dist=True)
    md = pickle.loads((directory / ".metadata").read_bytes())
    # 6000 chunks per tensor: a big, real-shaped file (the chunks need not tile for a parse)
    for fqn, item in md.state_dict_metadata.items():
        info = md.storage_data[MetadataIndex(fqn, torch.Size([0]))]
        for j in range(1, 6000):
            item.chunks.append(ChunkStorageMetadata(torch.Size([j]), torch.Size([1])))
            md.storage_data[MetadataIndex(fqn, torch.Size([j]))] = info
    (directory / ".metadata").write_bytes(pickle.dumps(md))
    assert (directory / ".metadata").stat().st_size > metadata.IN_PROCESS_MAX_BYTES
    auto = parse_with("auto", directory / ".metadata", monkeypatch)
    inside = parse_with("in-process", directory / ".metadata", monkeypatch)
    assert table_differences(auto, inside) == [] and auto.rows == 8 * 6000


METADATA_ATTACKS = [a for a in P.build_attacks() if a.allowlist == "metadata"]  # what the worker reads


@pytest.mark.parametrize("attack", METADATA_ATTACKS, ids=lambda a: a.name)
def test_no_build_attack_reaches_this_process(
    attack: P.BuildAttack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(attack.alone())
    got = outcome(path, monkeypatch)
    assert got["changed"] == [] and got["error"] in ("UnsafeCheckpoint", "CorruptCheckpoint"), got
    assert_one_line(got["message"])


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        (P.global_call("os", "system", "true"), "refused to load global os.system"),
        (P.stack_global_call("builtins", "eval", "1"), "refused to load global builtins.eval"),
        (P.ext_call(1), "not a valid pickle"),
    ],
)
def test_every_other_global_is_refused(
    payload: bytes, refused: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(payload)
    got = outcome(path, monkeypatch)
    assert got["changed"] == [] and refused in (got["message"] or ""), got
    assert_one_line(got["message"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "body",
    [P.tuple_bomb_as_key, P.join_bomb, P.call_args_bomb, P.big_int_key],
    ids=["tuple key of 2**60 leaves", "join bomb", "call arguments bomb", "huge integer key"],
)
def test_work_that_grows_faster_than_the_file_ends_at_the_workers_limits(
    body: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(P.PROTO2 + body() + b"N.")
    got = outcome(path, monkeypatch)
    assert got["error"] == "CorruptCheckpoint" and got["changed"] == [], got
    assert_one_line(got["message"])
    assert got["seconds"] < 2 * isolated.cpu_limit(path.stat().st_size) + 30


def test_a_memo_index_of_two_to_the_30_is_refused_not_allocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C's unpickler sizes its memo by the largest index: 2**30 entries would be 8 GiB."""
    path = tmp_path / ".metadata"
    path.write_bytes(b"\x80\x04N" + b"r" + (2**30).to_bytes(4, "little") + b".")
    got = outcome(path, monkeypatch)
    assert got["error"] == "CorruptCheckpoint" and got["changed"] == [], got


def test_a_worker_that_cannot_start_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ckpts: Path) -> None:
    monkeypatch.setattr(isolated.sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(CkptError, match="cannot start the metadata reader"):
        parse_with("isolated", ckpts / FSDP2_DCP / ".metadata", monkeypatch)
    assert os.path.exists(ckpts / FSDP2_DCP / ".metadata")


@pytest.mark.parametrize("attack", METADATA_ATTACKS, ids=lambda a: a.name)
def test_both_engines_judge_an_attack_spliced_into_a_real_metadata_alike(
    attack: P.BuildAttack, ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In front of a real ``.metadata`` an attack is refused by both engines or by neither.

    The fuzz found one the restricted engine refused and C's unpickler took: a dunder key in the
    state of a fresh stand-in, which C's ``BUILD`` put into the instance's ``__dict__``.
    """
    path = tmp_path / ".metadata"
    path.write_bytes(attack.before((ckpts / FSDP2_DCP / ".metadata").read_bytes()))
    verdicts = {}
    for engine in ("in-process", "isolated"):
        try:
            parse_with(engine, path, monkeypatch)
            verdicts[engine] = "accepted"
        except CkptError:  # how each engine names the refusal may differ (unsafe / corrupt)
            verdicts[engine] = "refused"
    assert verdicts["in-process"] == verdicts["isolated"], verdicts
