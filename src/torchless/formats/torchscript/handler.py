"""The ``torchscript`` format handler: ``torch.jit.save`` archives and lite ``.ptl`` files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...container.zip import is_zip
from ...core.errors import TorchlessError
from ...core.findings import Problem
from ...core.lazy import LazyModule
from ...core.tensor import Tensor
from ...core.tree import describe
from ...io.source import open_source
from ...pickle.torch_globals import TORCH_ALLOWLIST
from ..base import ZIP_CRC, Artifact, Capabilities, FormatHandler, LoadPolicy, Probe, summarize_tensors
from ..registry import register
from . import spec

if TYPE_CHECKING:  # the real modules, imported on first use at run time
    from . import flatbuffer as _fb
    from . import read as _read
else:
    _read = LazyModule("torchless.formats.torchscript.read")
    _fb = LazyModule("torchless.formats.torchscript.flatbuffer")

__all__ = [
    "TorchScriptArtifact",
    "FlatbufferArtifact",
    "TorchScriptHandler",
    "open_torchscript",
    "module_tree",
    "iter_all_tensors",
    "render_code",
    "find_module",
]


def _tensor_summary(t: Tensor) -> str:
    return f"{t.dtype.name}[{', '.join(map(str, t.shape))}]"


def _value_summary(v: Any) -> Any:
    if isinstance(v, Tensor):
        return _tensor_summary(v)
    if isinstance(v, _read.ScriptObject):
        return f"<{v.qualified_name}{'(' + repr(v.value) + ')' if v.args else ''}>"
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return describe(v)


def module_tree(m: _read.ScriptObject, limit: int = 10_000) -> dict[str, Any]:
    """A JSON-ready outline of a module: class, parameters, buffers, attributes, methods,
    then submodules (each module once)."""
    seen: set[int] = set()

    def go(x: _read.ScriptObject, budget: list[int]) -> dict[str, Any]:
        budget[0] -= 1
        out: dict[str, Any] = {"<object>": x.qualified_name}
        if id(x) in seen or budget[0] < 0:
            out["<object>"] += " (shown above)" if id(x) in seen else " (…)"
            return out
        seen.add(id(x))
        params = {k: _tensor_summary(v) if isinstance(v, Tensor) else v for k, v in x.attrs.items() if x._kind(k) == "parameter"}
        bufs = {k: _tensor_summary(v) if isinstance(v, Tensor) else v for k, v in x.attrs.items() if x._kind(k) == "buffer"}
        attrs = {
            k: _value_summary(v)
            for k, v in x.attrs.items()
            if x._kind(k) == "attribute" and k not in ("training", "_is_full_backward_hook")
        }
        if params:
            out["parameters"] = params
        if bufs:
            out["buffers"] = bufs
        if attrs:
            out["attributes"] = attrs
        if x.state is not None:
            out["state"] = describe(x.state)
        if x.methods:
            out["methods"] = ", ".join(x.methods)
        for k, v in x.attrs.items():
            if x._kind(k) == "module":
                out[k] = go(v, budget)
        return out

    return go(m, [limit])


def iter_all_tensors(root: Any, prefix: str = "", max_nodes: int = 50_000_000) -> Iterator[tuple[str, Tensor]]:
    """Every tensor reachable from ``root`` (attributes, containers, custom-class state),
    under dotted paths; each tensor object once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(prefix, root)]
    n = 0
    while stack:
        name, x = stack.pop()
        n += 1
        if n > max_nodes:
            from ...core.errors import LimitError

            raise LimitError("object tree too large", expected=f"<= {max_nodes} nodes")
        if isinstance(x, Tensor):
            if id(x) not in seen:
                seen.add(id(x))
                yield name or "tensor", x
            continue
        if id(x) in seen:
            continue
        kids: list[tuple[str, Any]] = []
        if isinstance(x, _read.ScriptObject):
            seen.add(id(x))
            kids = list(x.attrs.items())
            if x.state is not None:
                kids.append(("__getstate__", x.state))
        elif isinstance(x, dict):
            seen.add(id(x))
            kids = [(str(k), v) for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            seen.add(id(x))
            kids = [(str(i), v) for i, v in enumerate(x)]
        stack.extend(reversed([(f"{name}.{k}" if name else k, v) for k, v in kids]))


def find_module(root: Any, path: str | None) -> _read.ScriptObject:
    """The submodule at dotted ``path`` ("" or None: the root)."""
    from ...core.errors import NotFoundError

    m = root
    for part in [p for p in (path or "").split(".") if p]:
        if not isinstance(m, _read.ScriptObject) or not isinstance(m.attrs.get(part), _read.ScriptObject):
            raise NotFoundError(f"no submodule {path!r}", found=f"stopped at {part!r}")
        m = m.attrs[part]
    if not isinstance(m, _read.ScriptObject):
        raise NotFoundError("the archive's root is not a TorchScript object")
    return m


def render_code(archive: _read.TorchScriptArchive, *, method: str | None = None, module: str | None = None) -> str:
    """TorchScript source as text.

    * ``method`` (``forward``): that method of the root (or of submodule ``module``)
      as ``torch.jit.load(path).<module>.<method>.code`` prints it;
    * ``method`` qualified (``__torch__.M.forward``): that method or free function;
    * neither: every code file, each under a ``# code/…`` header, as stored.
    * only ``module``: the class source of that submodule, as stored.
    """
    if method and method.startswith("__torch__.") and module is None:
        return archive.function(method).code
    if method:
        return find_module(archive.module, module).method_source(method).code
    if module:
        m = find_module(archive.module, module)
        if m.class_source is None:
            from ...core.errors import NotFoundError

            raise NotFoundError(f"no source for class {m.qualified_name}")
        return m.class_source.text
    parts = []
    for rec, cf in archive.code.items():
        parts.append(f"# {rec}\n{cf.text}" + ("" if cf.text.endswith("\n") else "\n"))
    return "\n".join(parts)


class TorchScriptArtifact(Artifact):
    """An opened TorchScript archive.

    ``tensors()`` gives what ``torch.jit.load(path).state_dict()`` gives (same names,
    same order); :meth:`all_tensors` adds every other tensor (attributes, containers,
    packed quantized weights, constants). ``load()`` returns the root
    :class:`~torchless.formats.torchscript.read.ScriptObject`.

    Attributes:
        archive: the parsed :class:`~torchless.formats.torchscript.read.TorchScriptArchive`.
    """

    format = "torchscript"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, probe: Probe | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        pol = self.policy
        try:
            zr = probe.take_zip() if probe is not None else None
        finally:
            if probe is not None:
                probe.close()
        self.source = zr.source if zr is not None else open_source(path)
        try:
            self.archive: _read.TorchScriptArchive = _read.read_archive(
                zr if zr is not None else self.source,
                weights_only=pol.weights_only,
                limits=pol.limits,
                extra_globals=pol.extra_globals(),
            )
        except BaseException:
            self.source.close()
            raise

    @property
    def module(self) -> _read.ScriptObject:
        return self.archive.module

    def load(self, *, weights_only: bool | None = None) -> Any:
        """The root module, read under the policy given at open."""
        self.load_policy(weights_only)
        return self.archive.module

    def state_dict(self) -> Any:
        m = self.archive.module
        if not isinstance(m, _read.ScriptObject):
            from ...core.values import StateDict

            return StateDict()
        return m.state_dict()

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self.state_dict().items())

    def all_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """Every tensor of the module tree and of ``constants.pkl`` (``CONSTANTS.cN``)."""
        yield from iter_all_tensors(self.archive.module)
        consts = self.archive.constants
        if isinstance(consts, tuple):
            for i, c in enumerate(consts):
                yield from iter_all_tensors(c, f"CONSTANTS.c{i}")

    def code(self, method: str | None = None, module: str | None = None) -> str:
        """TorchScript source: one method as ``.code`` prints it, or all code files."""
        return render_code(self.archive, method=method, module=module)

    def info(self) -> dict[str, Any]:
        a = self.archive
        zr = a.zip
        assert zr is not None
        refused = sorted({g for g, ok in a.globals_seen if not ok})
        out: dict[str, Any] = {
            "format": "torchscript",
            "path": self.path,
            "container": "zip",
            "archive_prefix": a.prefix,
            "kind": "lite interpreter (.ptl)" if a.is_lite else "TorchScript",
            "file_format_version": a.file_format_version,
        }
        if a.is_lite:
            try:
                out["bytecode_version"] = a.bytecode().version
            except TorchlessError as e:
                out["bytecode_version"] = f"unreadable: {e}"
        root = a.module
        out["root_class"] = root.qualified_name if isinstance(root, _read.ScriptObject) else type(root).__name__
        out["traced"] = zr.lookup(spec.TRACED_INPUTS_PKL) is not None
        out["records"] = {k: v.strip() for k, v in a.records.items()}
        out.update(summarize_tensors(self.tensors()))
        everything = list(self.all_tensors())
        out["all_tensors"] = len(everything)
        out["all_tensor_bytes"] = sum(t.nbytes for _, t in everything)
        out["constants"] = len(a.constants) if isinstance(a.constants, tuple) else 0
        out["extra_files"] = {k: e.size for k, e in a.extra.items()}
        code_sizes = {rec[len(spec.CODE_DIR) :]: zr.get(rec).size for rec in a.code}
        out["code_files"] = code_sizes
        out["methods"] = {q: list(cs.methods) for q, cs in a.classes.items() if cs.methods}
        out["globals_not_allowlisted"] = refused
        out["torch_weights_only_would_refuse"] = sorted(
            {g for g, _ in a.globals_seen if g not in TORCH_ALLOWLIST and not g.startswith("__torch__.")}
        )
        if isinstance(root, _read.ScriptObject):
            out["tree"] = module_tree(root)
        else:
            out["tree"] = describe(root)
        return out

    def verify(self) -> list[Problem]:
        a = self.archive
        zr = a.zip
        assert zr is not None
        problems: list[Problem] = list(zr.verify(crc=True))
        for name, t in self.all_tensors():
            try:
                if t.storage is not None:
                    t._check_bounds()
                    t.storage.check()
            except TorchlessError as e:
                problems.append(Problem("tensor", str(e), name))
        # every class the pickles use should be defined by the archive's code
        stack: list[Any] = [a.module]
        seen: set[int] = set()
        while stack:
            x = stack.pop()
            if not isinstance(x, _read.ScriptObject) or id(x) in seen:
                continue
            seen.add(id(x))
            if x.class_source is None and not x.qualified_name.startswith("__torch__.torch.classes."):
                problems.append(
                    Problem("missing-class", f"class {x.qualified_name} has no source in code/", x.qualified_name, None, "error")
                )
            elif x.state is not None and x.is_module:
                problems.append(
                    Problem(
                        "setstate",
                        f"{x.qualified_name} is restored by its TorchScript __setstate__, which torchless "
                        "does not run: its tensors are in all_tensors() but not in the state_dict",
                        x.qualified_name,
                        None,
                        "warning",
                    )
                )
            elif x.class_source is not None:
                for n in x.class_source.parameters + x.class_source.buffers:
                    if n not in x.attrs:
                        problems.append(
                            Problem(
                                "missing-attribute",
                                f"{x.qualified_name} declares {n!r} but data.pkl has no value for it",
                                n,
                                None,
                                "error",
                            )
                        )
            stack.extend(v for v in x.attrs.values() if isinstance(v, _read.ScriptObject))
        used = {st.origin[len(zr.prefix) + 1 :] for st in a.storages.values() if st.origin}
        if a.is_lite:
            try:
                a.bytecode()
            except TorchlessError as e:
                problems.append(Problem("bytecode", str(e), spec.BYTECODE_PKL))
            used |= {st.origin[len(zr.prefix) + 1 :] for st in a.storages.values() if st.origin}
        for rec in zr.records():
            if (rec.startswith(spec.DATA_DIR + "/") or rec.startswith(spec.CONSTANTS_DIR + "/")) and rec not in used:
                problems.append(
                    Problem("unused-record", f"storage record {rec!r} is not referenced by any pickle", rec, None, "warning")
                )
        return problems

    def close(self) -> None:
        self.source.close()


class FlatbufferArtifact(Artifact):
    """A TorchScript mobile module in the flatbuffer container (``PTMF`` at byte 4;
    ``save_jit_module_to_flatbuffer``, ``_save_for_lite_interpreter(...,
    _use_flatbuffer=True)``).

    The same surface as :class:`TorchScriptArtifact`: ``tensors()`` is what
    ``torch.jit.load(path).state_dict()`` gives, ``all_tensors()`` adds the others,
    ``archive`` is the parsed :class:`~torchless.formats.torchscript.flatbuffer.FlatbufferModule`
    (module tree, ``jit_sources`` code, constants, extra files, ``bytecode()``).
    Tensors are zero-copy views of the file. Editing is not supported (no zip to rewrite).
    """

    format = "torchscript"

    def __init__(self, path: Any, policy: LoadPolicy | None = None, *, probe: Probe | None = None) -> None:
        super().__init__(path if not isinstance(path, (bytes, bytearray, memoryview)) else "<bytes>", policy)
        if probe is not None:
            probe.close()
        self.source = open_source(path)
        try:
            name = self.path if isinstance(self.path, str) else str(self.path)
            self.archive: _fb.FlatbufferModule = _fb.read_flatbuffer(
                self.source.view(0, self.source.size), name, source=self.source
            )
        except TorchlessError as e:
            self.source.close()
            e.with_context(path=self.path)
            raise
        except BaseException:
            self.source.close()
            raise

    @property
    def module(self) -> Any:
        return self.archive.module

    def load(self, *, weights_only: bool | None = None) -> Any:
        """The root module (the flatbuffer holds no pickle: nothing to refuse)."""
        self.load_policy(weights_only)
        return self.archive.module

    def state_dict(self) -> Any:
        m = self.archive.module
        if not isinstance(m, _read.ScriptObject):
            from ...core.values import StateDict

            return StateDict()
        return m.state_dict()

    def tensors(self) -> Iterator[tuple[str, Any]]:
        return iter(self.state_dict().items())

    def all_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """Every tensor of the module tree, then of ``jit_constants`` (``CONSTANTS.cN``)."""
        yield from iter_all_tensors(self.archive.module)
        for i, c in enumerate(self.archive.constants):
            yield from iter_all_tensors(c, f"CONSTANTS.c{i}")

    def code(self, method: str | None = None, module: str | None = None) -> str:
        """TorchScript source from ``jit_sources``: one method, or every source."""
        return render_code(self.archive, method=method, module=module)  # type: ignore[arg-type]  # duck-typed: a FlatbufferModule has the members render_code reads

    def info(self) -> dict[str, Any]:
        a = self.archive
        root = a.module
        bc = a.bytecode()
        out: dict[str, Any] = {
            "format": "torchscript",
            "path": self.path,
            "container": "flatbuffer",
            "kind": "mobile module, flatbuffer (PTMF)",
            "bytecode_version": a.bytecode_version,
            "operator_version": a.operator_version,
            "root_class": root.qualified_name if isinstance(root, _read.ScriptObject) else type(root).__name__,
        }
        out.update(summarize_tensors(self.tensors()))
        everything = list(self.all_tensors())
        out["all_tensors"] = len(everything)
        out["all_tensor_bytes"] = sum(t.nbytes for _, t in everything)
        out["storages"] = a.storage_count
        out["constants"] = len(a.constants)
        out["extra_files"] = {k: e.size for k, e in a.extra.items()}
        out["code_files"] = {rec[len(spec.CODE_DIR) :]: len(cf.text) for rec, cf in a.code.items()}
        out["methods"] = {m.qualified_name: len(m.instructions) for m in bc.methods}
        out["operators"] = sorted({o.full_name for m in bc.methods for o in m.operators})
        out["object_types"] = {n: k for n, k, _ in a.object_types}
        out["tree"] = module_tree(root) if isinstance(root, _read.ScriptObject) else describe(root)
        return out

    def verify(self) -> list[Problem]:
        problems: list[Problem] = []
        for name, t in self.all_tensors():
            try:
                if t.storage is not None:
                    t._check_bounds()
            except TorchlessError as e:
                problems.append(Problem("tensor", str(e), name))
        for m in self.archive.bytecode().methods:
            for i, ins in enumerate(m.instructions):
                table = {"OP": m.operators, "OPN": m.operators, "LOADC": m.constants}.get(ins.op)
                if table is not None and not 0 <= ins.x < len(table):
                    problems.append(
                        Problem(
                            "bytecode",
                            f"instruction {i} ({ins.op} {ins.x}) indexes past its table ({len(table)})",
                            m.qualified_name,
                        )
                    )
        return problems

    def close(self) -> None:
        self.source.close()


def open_torchscript(path: Any, policy: LoadPolicy | None = None) -> TorchScriptArtifact | FlatbufferArtifact:
    """A TorchScript zip archive or flatbuffer module, whichever ``path`` holds."""
    if not isinstance(path, (bytes, bytearray, memoryview)):
        with open(path, "rb") as f:
            head = f.read(8)
    else:
        head = bytes(path[:8])
    if spec.is_flatbuffer(head):
        return FlatbufferArtifact(path, policy)
    return TorchScriptArtifact(path, policy)


@register
class TorchScriptHandler(FormatHandler):
    """TorchScript archives (``torch.jit.save``), lite-interpreter ``.ptl`` files and
    flatbuffer mobile modules (``PTMF``)."""

    name = "torchscript"
    extensions = (".ptl", ".torchscript", ".ff")
    priority = 10  # before the plain zip checkpoint handler
    description = "TorchScript archive (torch.jit.save, _save_for_lite_interpreter)"
    capabilities = Capabilities(edit=True, checksum=ZIP_CRC + " (flatbuffer .ff/.ptl files: none)")

    def sniff(self, probe: Probe) -> bool:
        if probe.is_dir:
            return False
        if spec.is_flatbuffer(probe.head):
            return True
        if not is_zip(probe.head):
            return False
        return spec.is_torchscript_zip(probe.zip_records())

    def _open(self, path: Any, policy: LoadPolicy, probe: Probe | None) -> TorchScriptArtifact | FlatbufferArtifact:
        if probe is not None and spec.is_flatbuffer(probe.head):
            return FlatbufferArtifact(path, policy, probe=probe)
        if probe is None:
            return open_torchscript(path, policy)
        return TorchScriptArtifact(path, policy, probe=probe)
