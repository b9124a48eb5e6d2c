"""torchless: PyTorch's artifacts without torch.

Read, write, inspect, verify, security-scan and convert eager checkpoints, TorchScript
archives, ExportedProgram ``.pt2`` files, ONNX models, AOTInductor packages, distributed
checkpoints and the inductor cache, in pure Python on NumPy. Nothing a file names is ever
imported or called.

Example:
    >>> import torchless
    >>> sd = torchless.load("model.pt")               # doctest: +SKIP
    >>> sd["layer.weight"].numpy()                      # doctest: +SKIP
"""

# first, before any other import: a Ctrl-C while `torchless` starts prints no traceback
# (no `from __future__` line either: it is one more module to find before the handler)
from ._start import quiet_interrupts as _quiet
from ._start import running_as_cli as _is_cli

if _is_cli():  # `torchless ...`: a Ctrl-C during the imports below prints no traceback
    _quiet()

from ._api import capabilities, convert, detect, load, open, save, write_tensors
from .core.dtypes import DType
from .core.errors import (
    ChecksumError,
    FormatError,
    InternalError,
    LimitError,
    LinkEscapeError,
    NotFoundError,
    TorchlessError,
    TruncatedError,
    UnsafeGlobalError,
    UnsupportedError,
    UsageError,
    WriteError,
)
from .core.lazy import lazy_exports as _lazy_exports
from .core.tensor import JaggedTensor, NestedTensor, SparseTensor, Storage, Tensor, tensor
from .core.version import __version__ as __version__
from .formats.base import Artifact, Capabilities, LoadPolicy
from .pickle.globals import GlobalRef, PickledObject
from .pickle.machine import Limits

__all__ = [
    "Artifact",
    "Capabilities",
    "ChecksumError",
    "DType",
    "FormatError",
    "GlobalRef",
    "InternalError",
    "JaggedTensor",
    "LimitError",
    "Limits",
    "LinkEscapeError",
    "LoadPolicy",
    "NestedTensor",
    "NotFoundError",
    "PickledObject",
    "SparseTensor",
    "Storage",
    "Tensor",
    "TorchlessError",
    "TruncatedError",
    "UnsafeGlobalError",
    "UnsupportedError",
    "UsageError",
    "WriteError",
    "capabilities",
    "convert",
    "detect",
    "from_torch",
    "load",
    "open",
    "save",
    "scan",
    "tensor",
    "to_torch",
    "view",
    "write_tensors",
]


def to_torch(t: Tensor) -> object:
    """A torch tensor sharing ``t``'s bytes (needs torch; see :mod:`torchless.interop.torch`)."""
    from .interop.torch import to_torch as _to

    return _to(t)


def from_torch(t: object) -> Tensor:
    """A torchless tensor viewing a torch tensor's storage (needs torch)."""
    from .interop.torch import from_torch as _from

    return _from(t)


# ``torchless.scan`` and ``torchless.view`` are callable modules (``torchless.scan(path)``),
# imported on first use so that ``import torchless`` does not pay for them.
_lazy = _lazy_exports(__name__, {"scan": ".scan", "view": ".view"})


def __getattr__(name: str) -> object:
    return _lazy(name)
