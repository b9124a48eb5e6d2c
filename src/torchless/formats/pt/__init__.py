"""Eager checkpoints (``torch.save``): zip, legacy stream and legacy tar layouts."""
