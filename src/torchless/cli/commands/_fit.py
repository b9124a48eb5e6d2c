"""Which command fits which artifact: commands refuse the wrong kind of input by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.errors import UsageError

if TYPE_CHECKING:
    from ..._cli_api import Artifact, LoadPolicy

__all__ = ["open_required", "COMMAND_FOR"]

#: the format-specific command for each format (generic ones: info, ls, verify, diff)
COMMAND_FOR = {
    "pt": "torchless info",
    "safetensors": "torchless info",
    "npz": "torchless info",
    "torchscript": "torchless code",
    "pt2": "torchless graph",
    "onnx": "torchless onnx graph",
    "aoti": "torchless extract",
    "dcp": "torchless dcp-layout",
}

_WHAT = {
    "pt": "an eager torch checkpoint",
    "safetensors": "a safetensors file",
    "npz": "a NumPy .npz/.npy file",
    "torchscript": "a TorchScript archive",
    "pt2": "a torch.export .pt2 archive",
    "onnx": "an ONNX model",
    "aoti": "an AOTInductor package",
    "dcp": "a distributed (DCP) checkpoint",
}


def open_required(path: Any, wanted: tuple[str, ...], command: str, *, policy: LoadPolicy | None = None) -> Artifact:
    """``path`` opened by its handler if its detected format is one of ``wanted``: one
    detection, whose probe (with the parsed zip directory) the handler takes over, so the
    file is parsed once.

    Raises:
        UsageError: another kind of artifact; the message names what it is and which
            command fits it.
        NotFoundError, FormatError: missing or unrecognized.
    """
    from ..._cli_api import probe_and_detect

    h, probe = probe_and_detect(path)
    if h.name in wanted:
        return h.open(path, policy, probe=probe)
    if probe is not None:
        probe.close()
    fmt = h.name
    need = " or ".join(_WHAT.get(w, w) for w in wanted)
    fits = COMMAND_FOR.get(fmt)
    raise UsageError(
        f"`torchless {command}` needs {need}, and this is {_WHAT.get(fmt, fmt)}",
        path=path,
        hint=f"use `{fits} {path}`" if fits else None,
    )
