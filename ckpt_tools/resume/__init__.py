"""Resume prediction, torch-free: what the trainer will read from a checkpoint (source), how it
will start on a target topology (target), the checks between the two, and the two tools built
on them (``reshard-plan``, ``verify-resume``).
"""
