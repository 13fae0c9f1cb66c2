"""What a checkpoint's files say, read once for the rules.

The rules of :mod:`ckpt_tools.format` judge plain data - counters, shapes, stamps, param
groups - and never open a file, so the trainer and every tool can call them on whatever they
already hold. This package sits one layer above the readers (:mod:`ckpt_tools.st`,
:mod:`ckpt_tools.dcp`) and reads those facts from a step's files: one module per rule family,
each with the convenience that reads and judges in one call (``inconsistency(paths, record)``).
"""
