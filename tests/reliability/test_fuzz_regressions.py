"""One focused test per tool-side defect the fuzz suite found (docs/reliability.md); each failed before its fix.

The fuzz cases that found them are random; these pin each one down with the smallest input
that shows it, through the Python API (the CLI prints the same one-line errors).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from ckpt_tools.convert import convert_dcp
from ckpt_tools.dcp.metadata import parse_metadata
from ckpt_tools.errors import CheckpointError, CkptError, CorruptCheckpoint, UsageError, WriteError
from ckpt_tools.format import layout
from ckpt_tools.format.record import read_training_step
from ckpt_tools.format.train_config import read_saved_config
from ckpt_tools.inspect import inspect_path
from ckpt_tools.resume.plan import plan_reshard
from ckpt_tools.resume.verify import verify_resume
from ckpt_tools.st.header import read_header
from devtools.reliability import fuzz_mutations as M
from devtools.reliability import fuzz_payloads as P
from devtools.reliability.fuzz_runner import fenced
from devtools.training import step_dir


@pytest.fixture
def fsdp(runs: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the FSDP(2) safetensors_dcp checkpoint of step 4."""
    dst = tmp_path / "checkpoints" / "000004"
    shutil.copytree(step_dir(runs["fsdp"], 4), dst)
    os.symlink("000004", tmp_path / "checkpoints" / "last")
    return dst


@pytest.fixture
def ddp(runs: dict[str, Path], tmp_path: Path) -> Path:
    dst = tmp_path / "ddp" / "000004"
    shutil.copytree(step_dir(runs["ddp"], 4), dst)
    return dst


def arena_of(step: Path) -> M.Arena:
    return M.Arena(step.parents[1], step_rel=str(step.relative_to(step.parents[1])))


def failed(report: object) -> str:
    return " | ".join(c.message for c in report.failures)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- JSON that json cannot take


@pytest.mark.parametrize(
    "text",
    [P.json_nesting_bomb(100_000), '{"step": ' + "9" * 5000 + "}"],
    ids=["100k-deep", "5000-digit-int"],
)
def test_json_bombs_are_checkpoint_errors_not_tracebacks(fsdp: Path, text: str) -> None:
    for rel, reader in (
        ("training_state/training_step.json", read_training_step),
        ("pretrained_model/train_config.json", read_saved_config),
    ):
        path = fsdp / rel
        original = path.read_text()
        path.write_text(text)
        with pytest.raises(CheckpointError, match="not valid JSON"):
            reader(path)
        path.write_text(original)
    header = fsdp / "pretrained_model/model.safetensors"
    header.write_bytes(len(text.encode()).to_bytes(8, "little") + text.encode())
    with pytest.raises(CorruptCheckpoint, match="not valid JSON"):
        read_header(header)


def test_a_null_step_is_a_checkpoint_error(fsdp: Path) -> None:
    path = fsdp / "training_state/training_step.json"
    path.write_text(path.read_text().replace('"step": 4', '"step": null'))
    with pytest.raises(CheckpointError, match="'step' is null"):
        read_training_step(path)
    path.write_text(path.read_text().replace('"step": null', '"step": [' + "0, " * 100_000 + "0]"))
    with pytest.raises(CheckpointError) as e:
        read_training_step(path)
    assert len(str(e.value)) < 300  # the value is shortened, not pasted whole into the message


def verdicts(step: Path) -> dict[str, str]:
    """inspect's, verify-resume's and reshard-plan's answer on ``step``, or the error each raised."""
    out = {}
    for label, fn in (
        ("inspect", lambda: inspect_path(step).healthy),
        ("verify", lambda: verify_resume(step).resumable),
        ("plan", lambda: plan_reshard(step).workable),
    ):
        try:
            out[label] = str(fn())
        except CkptError as e:
            out[label] = type(e).__name__
    return out


# ---------------------------------------------------------------- FIFOs, devices, directories


# (file, inspect must call the step unhealthy, verify must call it not resumable)
SPECIAL_FILE_CASES = [
    ("training_state/training_step.json", True, True),
    ("pretrained_model/train_config.json", True, True),
    ("pretrained_model/model.safetensors", True, False),  # the resume loads the DCP shards instead
    ("training_state/scheduler_state.json", True, True),  # every resumable checkpoint holds it; always read
    ("pretrained_model/policy_preprocessor_step_0_normalizer_processor.safetensors", False, False),
    ("training_state/optimizer_0/.metadata", True, True),
    ("training_state/optimizer_0/__0_0.distcp", True, True),  # the optimizer's step counters are read from it
]


@pytest.mark.parametrize(("rel", "unhealthy", "unresumable"), SPECIAL_FILE_CASES)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_special_files_are_refused_without_blocking_or_reading_forever(
    fsdp: Path, rel: str, unhealthy: bool, unresumable: bool, kind: str
) -> None:
    path = fsdp / rel
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        path.mkdir()

    result = fenced(lambda: verdicts(fsdp), timeout=30, memory_cap=512 * 2**20)
    assert result["status"] == "done", result  # no hang, no crash, no memory blow-up
    assert not unhealthy or result["value"]["inspect"] != "True", result
    assert not unresumable or result["value"]["verify"] != "True", result
    assert not unresumable or result["value"]["plan"] != "True", result


# ---------------------------------------------------------------- amplification bombs


def test_expanded_view_of_a_few_bytes_cannot_demand_gigabytes(fsdp: Path) -> None:
    dcp = fsdp / M.MODEL_DCP
    buf = io.BytesIO()
    torch.save(torch.zeros(1).expand(2**16, 2**15), buf)  # 8 GiB viewed from 4 stored bytes
    offset, length = M.append_blob(dcp, "__0_0.distcp", buf.getvalue())
    md = M.load_torch_metadata(dcp)
    M._replace_tensor(md, "model.action_head.weight", (2**16, 2**15), "__0_0.distcp", offset, length)
    M.save_torch_metadata(dcp, md)
    out = fsdp.parent / "out"
    with pytest.raises(CorruptCheckpoint, match="expanded views larger than"):
        convert_dcp(fsdp, output=out, progress=False)
    assert not out.exists()


def test_shared_reference_chunk_flood_is_refused_from_the_file_size() -> None:
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    shared = TensorStorageMetadata(
        TensorProperties(dtype=torch.float32),
        torch.Size([4096]),
        [ChunkStorageMetadata(torch.Size([i]), torch.Size([1])) for i in range(4096)],
    )
    import pickle

    data = pickle.dumps(Metadata({f"t{i}": shared for i in range(3000)}, storage_data={}))
    assert len(data) < 600_000  # 12 million chunks described by a few hundred kilobytes
    with pytest.raises(CorruptCheckpoint, match="more chunks and values than a file of its size"):
        parse_metadata(data)


def test_reference_bomb_in_an_optimizer_item_is_skipped_with_a_note(fsdp: Path) -> None:
    import random

    bomb = P.reference_bomb(10, 10)  # 10**10 values in ~250 bytes
    M._place_pickle(arena_of(fsdp), M.OPTIMIZER_DCP, "byte_item", bomb, "deep_pickle", random.Random(3))
    result = fenced(
        lambda: list(convert_dcp(fsdp, what="optimizer", output=fsdp.parent / "o", progress=False).notes),
        timeout=60,
        memory_cap=512 * 2**20,
    )
    assert result["status"] == "done", result
    assert any("too many values" in note for note in result["value"]), result


def test_running_out_of_memory_while_assembling_is_a_write_error(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "pytorch_model_fsdp_0"
    # Strided, so it is assembled in memory; 128 MiB, above glibc's largest mmap threshold (32 MiB),
    # so the buffer is always a fresh mapping that the cap sees, never reused free heap.
    dcp.save({"model": {"w": torch.randn(4096, 8192).t()}}, checkpoint_id=src, no_dist=True)

    def convert() -> str:
        try:
            convert_dcp(src, output=tmp_path / "out", progress=False)
        except WriteError as e:
            return str(e)
        return "converted"

    result = fenced(convert, timeout=60, memory_cap=8 * 2**20)
    assert result["status"] == "done", result
    assert "not enough memory" in result["value"]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---------------------------------------------------------------- links


def test_a_last_link_that_loops_is_no_usable_last(fsdp: Path) -> None:
    root = fsdp.parent
    (root / "last").unlink()
    os.symlink("last", root / "last")
    assert layout.resolve_last(root) is None
    with pytest.raises(CheckpointError, match="'last' is missing or dangling"):
        verify_resume(root)


def test_delete_dcp_through_a_symlinked_dcp_dir_is_refused_before_any_work(fsdp: Path, tmp_path: Path) -> None:
    dcp = fsdp / M.MODEL_DCP
    moved = tmp_path / "elsewhere"
    shutil.move(str(dcp), moved)
    os.symlink(moved, dcp)
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="is a symlink"):
        convert_dcp(fsdp, output=out, delete_dcp=True, progress=False)
    assert not out.exists() and (moved / ".metadata").exists()


# ---------------------------------------------------------------- verify-resume agrees with the trainer


def test_verify_refuses_optimizer_items_that_would_run_code_on_resume(fsdp: Path) -> None:
    import random

    sentinel = fsdp.parent / "PWNED"
    payload = P.CallablePayload("os:system", "global").build(str(sentinel))
    M._place_pickle(arena_of(fsdp), M.OPTIMIZER_DCP, "byte_item", payload, "callable", random.Random(0))
    report = verify_resume(fsdp)
    assert not report.resumable and "refused to load global os.system" in failed(report)
    assert not sentinel.exists()


def test_verify_refuses_flat_optimizer_keys_the_loader_cannot_place(ddp: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from ckpt_tools.train.checkpoint.state_dicts import _split_flat

    path = ddp / "training_state/optimizer_state.safetensors"
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()  # the names by position stay: only the stray key is new
    tensors["stray"] = torch.zeros(1)
    save_file(tensors, str(path), metadata=metadata)
    report = verify_resume(ddp)
    assert not report.resumable and "holds 'stray'" in failed(report)
    with pytest.raises(CheckpointError):  # what the training core's loader does with it
        _split_flat("stray", ["encoder.weight"], ["encoder.weight"])


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda c: c.update(step=4), "unknown field 'step'"),
        (lambda c: c.update(parallelism=None), "parallelism is NoneType"),
        (lambda c: c.update(policy=[]), "policy is list"),
        (lambda c: c.pop("policy"), "no policy"),
        (lambda c: c.update(batch_size=[8]), "batch_size is list"),
    ],
)
def test_verify_refuses_a_train_config_the_trainer_refuses(ddp: Path, edit: object, needle: str) -> None:
    import json

    path = ddp / "pretrained_model/train_config.json"
    config = json.loads(path.read_text())
    edit(config)  # type: ignore[operator]
    path.write_text(json.dumps(config))
    report = verify_resume(ddp)
    assert not report.resumable and needle in failed(report)


@pytest.mark.parametrize("value", ['"x"', "[]", "7"])
def test_verify_refuses_scheduler_state_that_is_not_an_object(ddp: Path, value: str) -> None:
    (ddp / "training_state/scheduler_state.json").write_text(value)
    report = verify_resume(ddp)
    assert not report.resumable and "scheduler_state.json: expected a JSON object, not " in failed(report)


def test_fifo_check_leaves_regular_files_alone(fsdp: Path) -> None:
    assert stat.S_ISREG(os.stat(fsdp / "training_state/training_step.json").st_mode)
    assert verify_resume(fsdp).resumable


# ---------------------------------------------------------------- chunk archives


def test_a_zip_member_whose_local_header_lies_past_the_archive_is_corrupt(fsdp: Path) -> None:
    """A central-directory entry pointing past its archive: named as corrupt, not an IndexError.

    Only the members a chunk's layout needs are opened; the others' header offsets were still
    used to mask their CRC fields in the archive template (the fuzz found it with 0x7fffffff).
    """
    shard = fsdp / "training_state/optimizer_0/__0_0.distcp"
    data = bytearray(shard.read_bytes())
    name = b"/.storage_alignment"
    central = data.find(b"PK\x01\x02")
    while central >= 0 and data[central + 46 : central + 46 + 200].split(b"PK")[0].find(name) < 0:
        central = data.find(b"PK\x01\x02", central + 4)
    assert central >= 0, "the first chunk's archive lists .storage_alignment"
    data[central + 42 : central + 46] = (0x7FFFFFFF).to_bytes(4, "little")  # its local header offset
    shard.write_bytes(bytes(data))

    result = fenced(lambda: verdicts(fsdp), timeout=60, memory_cap=512 * 2**20)
    assert result["status"] == "done", result  # a traceback in the fenced child is status "error"
    assert result["value"] == {"inspect": "False", "verify": "False", "plan": "False"}, result
