"""The policies ckpt-train builds: configs in ``configs``, modules and ``make_policy`` in ``registry``.

This package's ``__init__`` imports nothing, so that ``policies.configs`` (torch-free, what flag
parsing needs) can be imported without torch.
"""
