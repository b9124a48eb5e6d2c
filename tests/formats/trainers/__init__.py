"""Training-framework checkpoints: Hugging Face Trainer / Accelerate folders, Lightning .ckpt.

Fixtures are made by the frameworks themselves (``frameworks.py``: a real ``Trainer``,
``Accelerator.save_state``, Lightning ``Trainer``); oracles are their own loaders
(``torch.load``, ``safetensors``), compared bit for bit.
"""
