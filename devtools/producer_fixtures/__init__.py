"""Checkpoints written by other trainers' real save code, for fixtures/producers/ (see bin/make-producer-fixtures)."""
