"""Which format a run's checkpoints hold, given its ``--checkpoint_format`` and whether it is sharded.

Its own module: the manifest (what a step holds) and the start-up rules (what a launch refuses)
both ask, and the start-up rules read checkpoints through the manifest.
"""

from __future__ import annotations

from ckpt_tools.format.layout import CheckpointFormat


def saved_format(fmt: CheckpointFormat, sharded: bool) -> CheckpointFormat:
    """The format a run saves in: a non-sharded run has nothing to shard, so it saves one safetensors file."""
    return fmt if sharded else CheckpointFormat.SAFETENSORS
