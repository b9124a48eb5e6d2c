"""``python -m torchless``: the command line (torchless.cli.main)."""

from torchless.cli.main import entry

entry()
