"""Saving and loading training checkpoints: the manager (sync and async saves), the save job
that writes a hidden directory and commits it, the loaders, and the per-part writers (DCP,
gathered safetensors, flat optimizer files, RNG).
"""
