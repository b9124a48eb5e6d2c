"""The ``torchless`` command line. Each command: parse -> one library call -> render."""
