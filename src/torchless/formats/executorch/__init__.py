"""ExecuTorch programs (``.pte``): the FlatBuffers program and its data segments."""
