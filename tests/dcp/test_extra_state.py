"""A module's extra state kept as an ``io.BytesIO`` (some fp8 and kernel libraries do): a normal checkpoint.

torch's state dicts carry ``get_extra_state()`` under ``<module>._extra_state``, and DCP saves
it as a non-tensor item (a pickled object). ``inspect`` refused the ``BytesIO`` class and
called such checkpoints UNHEALTHY, although reading its state runs no code. The checkpoints
here are written by torch's own ``dcp.save``.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from ckpt_tools.convert import convert_dcp
from ckpt_tools.dcp.reader import read_pickled_object
from ckpt_tools.dcp.validate import PLAIN_OBJECTS, BytesIOState
from ckpt_tools.errors import CkptError
from ckpt_tools.inspect import inspect_path


class WithExtraState(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def get_extra_state(self) -> io.BytesIO:
        buffer = io.BytesIO()
        buffer.write(b"amax history \x00\xff")
        return buffer

    def set_extra_state(self, state: Any) -> None:
        pass


def _save(directory: Path, state: dict[str, Any]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that no process group is initialized
        dcp.save(state, checkpoint_id=str(directory))
    return directory


def test_bytesio_extra_state_is_healthy_and_converts(tmp_path: Path) -> None:
    module = WithExtraState()
    directory = _save(tmp_path / "dcp", {"model": module.state_dict()})
    report = inspect_path(directory)
    assert report.healthy, [c.message for c in report.checks if not c.ok]
    out = tmp_path / "model.safetensors"
    convert_dcp(directory, output=out)
    loaded = load_file(out)  # the reference reader
    assert sorted(loaded) == ["lin.bias", "lin.weight"]  # the "model." prefix of the state dict is dropped
    assert torch.equal(loaded["lin.weight"], module.lin.weight.detach())


def test_the_state_is_read_as_data(tmp_path: Path) -> None:
    archive = tmp_path / "item.pt"
    torch.save({"extra": WithExtraState().get_extra_state()}, archive)
    fd = os.open(archive, os.O_RDONLY)
    try:
        loaded = read_pickled_object(fd, 0, archive.stat().st_size, PLAIN_OBJECTS, what="item")
    finally:
        os.close(fd)
    state = loaded["extra"]
    assert type(state) is BytesIOState  # data, not a stream
    assert (state.value, state.position) == (b"amax history \x00\xff", 15)


class _TooMuchState:
    """Pickles as ``BytesIO()`` with a state of five values: not what a BytesIO holds."""

    def __reduce__(self) -> Any:
        return (io.BytesIO, (), (b"x", 0, None, "more", "still more"))


def test_a_bytesio_state_beyond_its_fields_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "item.pt"
    torch.save({"extra": _TooMuchState()}, archive)
    fd = os.open(archive, os.O_RDONLY)
    try:
        with pytest.raises(CkptError):
            read_pickled_object(fd, 0, archive.stat().st_size, PLAIN_OBJECTS, what="item")
    finally:
        os.close(fd)
