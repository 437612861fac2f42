"""``python -m packer`` is the ``packer`` command."""

from packer.cli import main

main()
