"""DeepSpeed ZeRO checkpoints (stages 1, 2 and 3), consolidated without torch or DeepSpeed."""
