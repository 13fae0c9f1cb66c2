"""Generated DCP checkpoints at cluster scale, and the benchmark of the tools on them.

Nobody here can run 1024 ranks, so the checkpoint a Llama-shaped model would leave behind is
*generated*: the ``.metadata`` is built from torch's own classes and pickled as torch's
``FileSystemWriter`` pickles it, every chunk's place is planned by the rules torch's save
planner follows (FSDP2 dim-0 shards, the replica de-duplication of HSDP, the split of a rank's
items over its writer threads' files), and the shard files are sparse: each chunk's torch.save
archive is there byte for byte except its tensor data, which is a hole that reads as zeros.
The files around the shards (records, configs, RNG and scheduler state) are those the trainer
writes, through the project's own writers. :mod:`devtools.scale.real_save` checks all of it
against a real ``dcp.save`` at a small world size.

    python -m devtools.scale --model 7b --layout fsdp --ranks 64 --out /scratch/llama7b-64
    bin/bench-scale --models 7b --ranks 8 64 256      # the tools on such checkpoints
"""
