"""CLI commands, one module per group (listed in ``torchless.cli.main.COMMAND_MODULES``)."""
