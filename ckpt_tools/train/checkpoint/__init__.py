"""Saving and loading training checkpoints: the manager (sync and async saves), the save job
that writes a hidden directory and commits it, the load half, and each part's save/load pair
(``parts.py``: DCP shards, gathered safetensors, flat optimizer files, RNG, sidecars).
"""
