"""The published copy of a DCP ``.metadata``: torch's ``checkpoint_id`` made relative, nothing else changed.

The pickles here are built by the standard pickler from plain data shaped like torch's
``StorageMeta`` (a dict whose ``checkpoint_id`` is a string or a ``pathlib`` path), in every
protocol torch could have written, so the test needs no torch; the trainer-written case is in
tests/hub/test_hub_push_scopes.py.
"""

from __future__ import annotations

import pickle
from pathlib import PurePosixPath, PureWindowsPath

import pytest

from ckpt_tools.dcp.published import NotRewritable, relocated_metadata

PUBLISHED = "checkpoints/005000/pretrained_model/pytorch_model_fsdp_0"
PROTOCOLS = (2, 3, 4, 5)


def _metadata(checkpoint_id: object, **extra: object) -> dict[str, object]:
    chunks = {f"layer.{i}.weight": [i, i * 64, "__0_0.distcp"] for i in range(2000)}  # several pickle frames
    return {"state_dict_metadata": chunks, "storage_meta": {"checkpoint_id": checkpoint_id, "save_id": "abc"}, **extra}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "local",
    [
        "/home/alice/outputs/run/checkpoints/.005000.partial/pretrained_model/pytorch_model_fsdp_0",
        PurePosixPath("/Users/bob/outputs/run/checkpoints/.005000.partial/pretrained_model/pytorch_model_fsdp_0"),
        PureWindowsPath("C:\\Users\\carol\\run\\checkpoints\\.005000.partial\\pretrained_model\\pytorch_model_fsdp_0"),
    ],
)
def test_a_local_checkpoint_id_becomes_the_published_dir(local: object, protocol: int) -> None:
    original = _metadata(local, planner_data={"owner": "alice", "host": "bob"})  # equal strings, memo-shared
    data = pickle.dumps(original, protocol=protocol)
    copy = relocated_metadata(data, PUBLISHED)
    assert copy is not None
    for name in (b"Users", b"home", b"partial", b"carol"):
        assert name not in copy
    loaded = pickle.loads(copy)  # our own test data: safe to load
    published = loaded["storage_meta"]["checkpoint_id"]
    assert str(published).replace("\\", "/") == PUBLISHED and type(published) is type(local)
    assert loaded == {**original, "storage_meta": {"checkpoint_id": published, "save_id": "abc"}}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("checkpoint_id", [None, "relative/dir"])
def test_nothing_local_is_left_as_it_is(checkpoint_id: object, protocol: int) -> None:
    assert relocated_metadata(pickle.dumps(_metadata(checkpoint_id), protocol=protocol), PUBLISHED) is None
    assert relocated_metadata(pickle.dumps({"state_dict_metadata": {}}, protocol=protocol), PUBLISHED) is None


def test_an_unknown_form_is_refused_not_published() -> None:
    with pytest.raises(NotRewritable, match="neither a string nor a pathlib path"):
        relocated_metadata(pickle.dumps(_metadata(["/home/alice/run"]), protocol=4), PUBLISHED)
    with pytest.raises(NotRewritable, match="not a readable pickle"):
        relocated_metadata(pickle.dumps(_metadata("/home/alice/run"), protocol=4)[:-40], PUBLISHED)
