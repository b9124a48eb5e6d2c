"""Distributed checkpoints (``torch.distributed.checkpoint``): read, consolidate, reshard, write.

See ``docs/dcp.md``. The public entry point is :mod:`torchless.dcp`.
"""
