"""File-system primitives: bounded, hardened reads of untrusted files; durable atomic writes;
early disk writeback for large streamed files.
"""
