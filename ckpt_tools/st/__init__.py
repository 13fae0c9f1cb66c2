"""The safetensors format, torch-free: header parsing and validation, a streaming writer, and
the dtype table shared with the DCP reader.
"""
