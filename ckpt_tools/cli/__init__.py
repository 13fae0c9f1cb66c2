"""The ``ckpt-tools`` Typer app: parsing and printing only; the work lives in the API modules."""

from ckpt_tools.cli.app import app, main

__all__ = ["app", "main"]
