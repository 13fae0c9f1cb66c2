"""The reliability harness: crash trials (kills, full disks, rank death) and the checkpoint
fuzzers, run in small slices by the tests and in full by ``bin/reliability-report``.
"""
