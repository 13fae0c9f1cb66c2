"""SIGTERM agreement: a signal that lands while the ranks sit in the agreement all-reduce is kept.

Found by ``bin/reliability-report``: SIGTERM sent to torchrun reached both workers while they
waited in the all-reduce of ``StopRequest.agreed``; the handler set the flag, and the line after
the all-reduce overwrote it with the (older) agreed value, so neither rank ever stopped and
torchrun SIGKILLed them 30 s later, mid-save. Here the signal is delivered at exactly that
moment (right after the real gloo all-reduce returns, before ``agreed`` reads the result).
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ckpt_tools.train import stopping
from ckpt_tools.train.parallel.distributed import DistEnv
from ckpt_tools.train.stopping import StopRequest


@pytest.fixture
def one_rank_group() -> Iterator[DistEnv]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield DistEnv(0, 0, 1, 1, torch.device("cpu"), "gloo")
    finally:
        dist.destroy_process_group()


def test_a_sigterm_during_the_agreement_is_acted_on_at_the_next_step(
    one_rank_group: DistEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = StopRequest.install()
    real_all_reduce = dist.all_reduce
    delivered = []

    def all_reduce_then_signal(*args: Any, **kwargs: Any) -> Any:
        out = real_all_reduce(*args, **kwargs)
        if not delivered:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before control returns to agreed
            delivered.append(True)
        return out

    monkeypatch.setattr(stopping.dist, "all_reduce", all_reduce_then_signal)
    try:
        assert request.agreed(one_rank_group) is False  # the ranks agreed before the signal
        assert request.requested  # ... but it is not forgotten
        assert request.agreed(one_rank_group) is True  # every rank stops at the next step
        assert request.stopping
    finally:
        request.uninstall()
