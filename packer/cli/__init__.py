"""The ``packer`` command: options parsed and checked (commands), one library call each, and
what a person sees (views, terminal) or a script reads (``--json``)."""

from packer.cli.commands import cli, main

__all__ = ["cli", "main"]
