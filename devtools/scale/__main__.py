"""``python -m devtools.scale``: generate one scale checkpoint (what it holds: the package's docstring).

For example::

    python -m devtools.scale --model 7b --layout fsdp --ranks 1024 --out /scratch/l7-1024
    python -m devtools.scale --model 70b --layout hsdp --ranks 256 --out /scratch/l70 --metadata-only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devtools.scale.generate import GenerationRefused, Recipe, generate
from devtools.scale.run import TrainingRun
from devtools.scale.shapes import MODELS
from devtools.scale.world import LAYOUTS, RANKS_PER_NODE, World


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--layout", choices=LAYOUTS, required=True)
    parser.add_argument("--ranks", type=int, required=True, help="world size")
    parser.add_argument("--out", type=Path, required=True, help="run dir: gets checkpoints/<step>/ and last")
    parser.add_argument(
        "--hsdp-shard", type=int, default=RANKS_PER_NODE, help="HSDP shard group size (default: a node)"
    )
    parser.add_argument("--threads", type=int, default=4, help="DCP writer threads (= files) per rank (default 4)")
    parser.add_argument(
        "--crc32", action="store_true", help="archives with torch.save's CRC32 (the trainer's are without)"
    )
    parser.add_argument("--metadata-only", action="store_true", help="write .metadata but no shard files")
    parser.add_argument(
        "--index",
        action=argparse.BooleanOptionalAction,
        help="write the chunk index the trainer writes beside .metadata (default: when this checkout's trainer does)",
    )
    parser.add_argument("--step", type=int, default=TrainingRun.step)
    parser.add_argument("--overwrite", action="store_true", help="replace a step directory already there")
    args = parser.parse_args(argv)
    try:
        world = World.of(args.layout, args.ranks, args.hsdp_shard)
        recipe = Recipe(
            MODELS[args.model],
            world,
            threads=args.threads,
            crc32=args.crc32,
            shards=not args.metadata_only,
            index=args.index,
            run=TrainingRun(step=args.step),
        )
        made = generate(args.out, recipe, overwrite=args.overwrite)
    except (GenerationRefused, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{made.step_dir}: {recipe.label()}, {made.chunks:,} chunks, .metadata {made.metadata_bytes / 2**20:.1f} MiB,"
          f" {made.model.files + made.optimizer.files} shard files, generated in {made.seconds:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
