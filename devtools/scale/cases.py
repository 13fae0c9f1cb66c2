"""The small worlds a real ``dcp.save`` is compared with the generator on.

Together they cover what the generator must get right: uneven FSDP2 shards and several empty
ones sharing a box (:data:`~devtools.scale.shapes.TINY` over 4 ranks), HSDP's replica
de-duplication, and a rank's writes split over several files by writer threads - with more
threads than writes, the empty files torch still creates. Every case fits one 4-process
torchrun launch (the 2-rank one on a sub-mesh).
"""

from __future__ import annotations

from dataclasses import dataclass

from devtools.scale.run import TrainingRun
from devtools.scale.world import World

LAUNCH_RANKS = 4
RUN = TrainingRun(step=1, steps=10, batch_size=2)


@dataclass(frozen=True)
class Case:
    label: str
    world: World
    threads: int


CASES = (
    Case("fsdp2", World(1, 2), 1),
    Case("fsdp4", World(1, 4), 1),
    Case("fsdp4-threads3", World(1, 4), 3),
    Case("hsdp2x2", World(2, 2), 1),
    Case("hsdp2x2-threads2", World(2, 2), 2),
    Case("hsdp2x2-threads12", World(2, 2), 12),  # more files than a rank has writes: some stay empty
)
