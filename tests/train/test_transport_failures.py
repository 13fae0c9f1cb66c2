"""Which errors of a collective mean "another rank died or stalled" (one line, not a traceback)."""

from __future__ import annotations

import pytest

from ckpt_tools.train.parallel.distributed import is_transport_failure


@pytest.mark.parametrize(
    "text",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234",
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv",
        "Application timeout caused pair closure",  # seen when the stalled rank's peer gave up mid-transfer
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer",
    ],
)
def test_gloo_failures_of_a_lost_or_stalled_peer_are_transport_failures(text: str) -> None:
    assert is_transport_failure(RuntimeError(text))


def test_other_runtime_errors_are_not() -> None:
    assert not is_transport_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"))
    assert not is_transport_failure(ValueError("Connection closed by peer"))
