"""SIGTERM: stop at the next step boundary, with every rank agreeing on which one.

A scheduler's preemption or ``kill`` reaches the ranks at slightly different moments; if each
stopped on its own, some would wait forever in a collective the others never enter. So the
handler only raises a flag, and in every step the ranks agree (a max all-reduce, the one
that agrees on non-finite values when the step updates the weights) whether any of them saw it. The loop then leaves together, an in-flight
background save is completed (never left half-visible), and the run exits with 143.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from ckpt_tools.errors import CkptError
from ckpt_tools.train.parallel.distributed import DistEnv


class TrainingStopped(CkptError):
    exit_code = 143  # type: ignore[assignment]  # 128 + SIGTERM, as shells report it


_sigterm_seen = False  # any SIGTERM this process got while a StopRequest was installed


def sigterm_seen() -> bool:
    """Did the launcher already ask this process to stop (a SIGTERM the handler took)?"""
    return _sigterm_seen


class StopRequest:
    def __init__(self) -> None:
        self.requested = False  # this rank got SIGTERM (set by the handler only)
        self.stopping = False  # every rank agreed to stop (set by ``agreed`` or ``settle`` only)
        self._settled = False  # this step's agreement was already reached in another collective
        self._previous: Any = None

    @classmethod
    def install(cls) -> StopRequest:
        request = cls()
        request._previous = signal.signal(signal.SIGTERM, request._handle)
        return request

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        global _sigterm_seen
        self.requested = True
        _sigterm_seen = True

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def settle(self, agreed: bool) -> None:
        """This step's agreement, reached in another all-reduce of this step (the non-finite check's).

        Every rank calls it in the same step, so the next :meth:`agreed` returns it without a
        collective of its own. A SIGTERM that lands after it is left in ``requested`` for the
        next step, as one that lands during :meth:`agreed`'s all-reduce is.
        """
        self.stopping = agreed
        self._settled = True

    def agreed(self, env: DistEnv) -> bool:
        """Collective: True on every rank, at the same step, once any rank got SIGTERM.

        The result is what the all-reduce said, never this rank's flag read afterwards: a
        signal that lands while the all-reduce runs (ranks wait there, so it often does) is
        left in ``requested`` for the next call, not lost and not acted on by one rank alone.
        """
        if not env.distributed:
            self.stopping = self.requested
            return self.stopping
        if self._settled:
            self._settled = False
            return self.stopping
        flag = torch.tensor([int(self.requested)], device=env.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.stopping = bool(flag.item())
        return self.stopping
