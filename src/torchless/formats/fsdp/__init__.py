"""FSDP per-rank ``torch.save`` state dicts (FSDP2 DTensors), consolidated without torch."""
