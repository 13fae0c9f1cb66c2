"""The on-disk contract both halves share, torch-free: file names of the layout, the
``training_step.json`` record, the saved ``train_config.json``, the checkpoint manifest and the
rules that decide how a run starts and whether it can resume. The trainer and every tool import
these; nothing here is written twice.
"""
