"""Small value types that stand for torch objects found in checkpoints.

They are plain data: a ``torch.Size`` is a tuple, a ``torch.device`` a string-like value,
a state dict an ``OrderedDict`` that can also carry attributes (``_metadata``), exactly
as torch's objects carry them. :class:`GlobalRef` and :class:`PickledObject` are the inert
placeholders the pickle machine leaves for globals it does not resolve (they live here so
that walking an object tree, :mod:`torchless.core.tree`, needs nothing from ``pickle/``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .dtypes import DType

__all__ = [
    "Device",
    "GlobalRef",
    "Layout",
    "MemoryFormat",
    "Namespace",
    "PickledObject",
    "QScheme",
    "Size",
    "StateDict",
    "StorageType",
    "TensorType",
    "TorchVersion",
]


class Size(tuple[int, ...]):
    """``torch.Size``: a tuple of ints."""

    def __repr__(self) -> str:
        return f"torch.Size({list(self)})"


class Device(str):
    """``torch.device``: the string form (``"cuda:0"``) with ``type`` and ``index``."""

    @classmethod
    def make(cls, type_: str, index: int | None = None) -> Device:
        return cls(type_ if index is None else f"{type_}:{index}")

    @property
    def type(self) -> str:
        return self.split(":", 1)[0]

    @property
    def index(self) -> int | None:  # type: ignore[override]  # torch.device.index (the device number) shadows str.index
        parts = self.split(":", 1)
        return int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else None

    def __repr__(self) -> str:
        return f"device({str(self)!r})"


class _Named(str):
    prefix = "torch."

    def __repr__(self) -> str:
        return f"{self.prefix}{str(self)}"


class Layout(_Named):
    """A tensor layout name: ``strided``, ``sparse_coo``, ``sparse_csr`` ..."""


class QScheme(_Named):
    """A quantization scheme name: ``per_tensor_affine`` ..."""


class MemoryFormat(_Named):
    """A memory format name: ``contiguous_format``, ``channels_last`` ..."""


class TorchVersion(str):
    """``torch.torch_version.TorchVersion``: a version string."""


class StorageType:
    """A storage class named by a checkpoint (``torch.FloatStorage``), with its dtype.

    ``dtype`` is None for ``UntypedStorage`` (bytes) and ``TypedStorage``.
    """

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: DType | None) -> None:
        self.name = name
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"<storage type {self.name}>"


class TensorType:
    """A legacy tensor class (``torch.FloatTensor``), with its dtype."""

    __slots__ = ("name", "dtype", "sparse")

    def __init__(self, name: str, dtype: DType | None, sparse: bool = False) -> None:
        self.name = name
        self.dtype = dtype
        self.sparse = sparse

    def __repr__(self) -> str:
        return f"<tensor type {self.name}>"


class StateDict(OrderedDict[str, Any]):
    """``collections.OrderedDict`` that keeps attributes set by BUILD (``_metadata``).

    The attributes live in their own dictionary and are reachable as attributes only
    where no method has the name: a pickle cannot shadow ``items`` or ``keys``.
    """

    def __torchless_build__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, dict):
                    self.__torchless_build__(part)
            return
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise TypeError("OrderedDict state must be a dict of attributes")
        attrs = self.__dict__.setdefault("_torchless_attrs", {})
        attrs.update(state)

    def __getattr__(self, name: str) -> Any:
        attrs = self.__dict__.get("_torchless_attrs")
        if attrs is not None and name in attrs:
            return attrs[name]
        raise AttributeError(name)

    @property
    def attributes(self) -> dict[str, Any]:
        """Attributes the pickle set on the dict (``{"_metadata": ...}`` for state dicts)."""
        return dict(self.__dict__.get("_torchless_attrs", {}))

    def set_attribute(self, name: str, value: Any) -> None:
        self.__dict__.setdefault("_torchless_attrs", {})[name] = value


class Namespace:
    """``argparse.Namespace`` / ``types.SimpleNamespace``: attributes from the pickle."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update({k: v for k, v in kwargs.items() if not k.startswith("__")})

    def __torchless_build__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise TypeError("Namespace state must be a dict of attributes")
        # plain data attributes; dunder names could change how Python treats the object
        self.__dict__.update({k: v for k, v in state.items() if not k.startswith("__")})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Namespace) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # unhashable, as argparse.Namespace (object declares __hash__)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"Namespace({inner})"


class GlobalRef:
    """An inert reference to a global the file names but torchless will not resolve."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"<global {self.module}.{self.name}>"

    def __reduce__(self) -> Any:  # never re-pickle a placeholder as the real thing
        raise TypeError("GlobalRef placeholders cannot be pickled")


class PickledObject:
    """What a pickle would have built by calling an unresolved global; nothing was called.

    Attributes:
        cls: the :class:`GlobalRef` called (or instantiated).
        args: the positional arguments from the pickle.
        kwargs: keyword arguments (NEWOBJ_EX only).
        state: what BUILD set (``__dict__`` contents or a ``(dict, slots)`` pair).
        items: items added by APPEND(S)/SETITEM(S)/ADDITEMS, in order (``list`` of
            values or of ``(key, value)`` pairs), for subclasses of list/dict/set.
        via: the opcode that made it (``REDUCE``, ``NEWOBJ``, ``INST``, ``OBJ``...).
    """

    __slots__ = ("cls", "args", "kwargs", "state", "items", "via", "__weakref__")

    def __init__(
        self, cls: GlobalRef, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, via: str = "REDUCE"
    ) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs or {}
        self.state: Any = None
        self.items: list[Any] = []
        self.via = via

    @property
    def class_name(self) -> str:
        return self.cls.qualname

    @property
    def attrs(self) -> dict[str, Any]:
        """The instance dictionary as BUILD would have set it (empty when none)."""
        st = self.state
        if isinstance(st, tuple) and len(st) == 2:
            out: dict[str, Any] = {}
            for part in st:
                if isinstance(part, dict):
                    out.update(part)
            return out
        return st if isinstance(st, dict) else {}

    def __getattr__(self, item: str) -> Any:
        # explorable like the real object: module.weight -> the tensor in its state
        attrs = object.__getattribute__(self, "attrs")
        if item in attrs:
            return attrs[item]
        mods = attrs.get("_modules") or {}
        if isinstance(mods, dict) and item in mods:
            return mods[item]
        for key in ("_parameters", "_buffers"):
            d = attrs.get(key) or {}
            if isinstance(d, dict) and item in d:
                return d[item]
        raise AttributeError(item)

    def __repr__(self) -> str:
        return f"<{self.cls.qualname} (not imported)>"

    def __reduce__(self) -> Any:
        raise TypeError("PickledObject placeholders cannot be pickled")
