from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ts_files(tmp_path_factory, torch):
    """Every fixture archive (scripted, traced, quantized, lite at bytecode 4..8), built once."""
    from .models import build_all

    return build_all(str(tmp_path_factory.mktemp("torchscript")))


def as_torch_param(tl, tt):
    """torch.jit.load gives plain tensors for parameters; torchless marks them."""
    import torch

    return torch.nn.Parameter(tt, tt.requires_grad) if tl.is_parameter and not isinstance(tt, torch.nn.Parameter) else tt
