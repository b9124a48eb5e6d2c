"""Training-framework checkpoints: Hugging Face Trainer / Accelerate folders, Lightning ``.ckpt``."""
