"""The TorchScript source in ``code/``: classes, their declarations and methods.

The source is what torch's ``PythonPrint`` wrote (spec ``torchscript.md`` §3): top-level
``class Name(Module):`` blocks whose body declares ``__parameters__``, ``__buffers__``,
attribute types (``name : Type`` or ``__annotations__["0"] = Type``) and constants, then
``def`` methods indented by two spaces; free functions are top-level ``def`` blocks.
torchless only reads this text (to know which attributes are parameters and buffers and
to show the source); it never runs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

__all__ = ["ClassSource", "FunctionSource", "CodeFile", "parse_code_file", "method_code"]

_CLASS = re.compile(r"^class ([A-Za-z_][A-Za-z_0-9]*)(?:\((.*)\))?:\s*$")
_DEF = re.compile(r"^def ([A-Za-z_][A-Za-z_0-9]*)\(")
_MDEF = re.compile(r"^  def ([A-Za-z_][A-Za-z_0-9]*)\(")
_STRINGS = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ATTR = re.compile(r"^  ([A-Za-z_][A-Za-z_0-9]*) : (.+?)\s*$")
_ANNOT = re.compile(r'^  __annotations__\["((?:[^"\\]|\\.)*)"\] = (.+?)\s*$')
_LIST_DECL = re.compile(r"^  (__parameters__|__buffers__|__constants__) = \[(.*)\]\s*$")


@dataclass
class FunctionSource:
    """One ``def``: its name, the text as stored and where it lives.

    Attributes:
        name: the method or function name.
        qualified_name: ``<class qualified name>.<name>`` or ``<module>.<name>``.
        text: the source exactly as stored in the archive (with its indentation).
        owner: the qualified class name for methods, None for free functions.
    """

    name: str
    qualified_name: str
    text: str
    owner: str | None = None

    @property
    def code(self) -> str:
        """The source as torch's ``.code`` prints it (see :func:`method_code`)."""
        return method_code(self.text, self.owner)


@dataclass
class ClassSource:
    """One TorchScript class as declared in ``code/``.

    Attributes:
        name: the class name (``Linear``).
        qualified_name: ``__torch__.torch.nn.modules.linear.Linear``.
        base: what is in the parentheses (``Module``, ``NamedTuple``, ``Enum[int]``...).
        parameters / buffers: names listed in ``__parameters__`` / ``__buffers__``.
        attributes: attribute name -> declared TorchScript type, in declaration order.
        constants: names in ``__constants__`` plus ``Final`` declarations.
        methods: method name -> :class:`FunctionSource`, in source order.
        text: the whole class block as stored.
    """

    name: str
    qualified_name: str
    base: str
    parameters: list[str] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)
    attributes: dict[str, str] = field(default_factory=dict)
    constants: list[str] = field(default_factory=list)
    methods: dict[str, FunctionSource] = field(default_factory=dict)
    text: str = ""

    @property
    def is_module(self) -> bool:
        return self.base == "Module"

    @cached_property
    def parameter_set(self) -> frozenset[str]:
        return frozenset(self.parameters)

    @cached_property
    def buffer_set(self) -> frozenset[str]:
        return frozenset(self.buffers)


@dataclass
class CodeFile:
    """One ``code/…py`` record: the module name, classes and free functions."""

    record: str
    module: str
    text: str
    classes: dict[str, ClassSource] = field(default_factory=dict)
    functions: dict[str, FunctionSource] = field(default_factory=dict)


def _unescape(s: str) -> str:
    return s.replace('\\"', '"').replace("\\\\", "\\")


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """Spans of top-level blocks: from a line at column 0 to the next one."""
    starts = [i for i, ln in enumerate(lines) if ln and not ln[0].isspace()]
    spans = []
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else len(lines)
        spans.append((s, e))
    return spans


def parse_code_file(record: str, module: str, text: str) -> CodeFile:
    """Split one TorchScript source file into classes and functions (never executes it)."""
    cf = CodeFile(record, module, text)
    lines = text.splitlines(keepends=True)
    for s, e in _blocks(lines):
        head = lines[s].rstrip("\r\n")
        m = _CLASS.match(head)
        if m:
            name, base = m.group(1), (m.group(2) or "")
            cs = ClassSource(name, f"{module}.{name}", base, text="".join(lines[s:e]))
            _parse_class_body(cs, lines[s + 1 : e])
            cf.classes[name] = cs
            continue
        m = _DEF.match(head)
        if m:
            fname = m.group(1)
            cf.functions[fname] = FunctionSource(fname, f"{module}.{fname}", "".join(lines[s:e]))
    return cf


def _parse_class_body(cs: ClassSource, body: list[str]) -> None:
    i = 0
    n = len(body)
    while i < n:
        raw = body[i]
        ln = raw.rstrip("\r\n")
        m = _MDEF.match(ln)
        if m:
            j = i + 1
            # a method runs until the next line indented by at most two spaces
            while j < n:
                nxt = body[j]
                if nxt.strip() and not nxt.startswith("   "):
                    break
                j += 1
            mname = m.group(1)
            cs.methods[mname] = FunctionSource(mname, f"{cs.qualified_name}.{mname}", "".join(body[i:j]), cs.qualified_name)
            i = j
            continue
        m = _LIST_DECL.match(ln)
        if m:
            names = [_unescape(x) for x in _STRINGS.findall(m.group(2))]
            {"__parameters__": cs.parameters, "__buffers__": cs.buffers, "__constants__": cs.constants}[m.group(1)].extend(names)
        else:
            m = _ANNOT.match(ln)
            if m:
                cs.attributes[_unescape(m.group(1))] = m.group(2)
            else:
                m = _ATTR.match(ln)
                if m:
                    typ = m.group(2)
                    if typ.startswith("Final["):
                        cs.constants.append(m.group(1))
                    else:
                        cs.attributes[m.group(1)] = typ
        i += 1


def _signature_lines(lines: list[str]) -> int:
    """How many lines the ``def …:`` header spans (parentheses balanced, strings skipped)."""
    depth = 0
    quote = ""
    for i, ln in enumerate(lines):
        j = 0
        while j < len(ln):
            c = ln[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = ""
            elif c in "\"'":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            j += 1
        if depth <= 0 and ln.rstrip().endswith(":"):
            return i + 1
    return len(lines)


def method_code(text: str, owner: str | None) -> str:
    """A stored method's text in the form ``ScriptModule.<method>.code`` prints it.

    In the archive, methods sit inside their class (two more spaces of indentation) and
    ``self`` carries its type (``self: __torch__.M``); torch prints a method on its own
    without both.
    """
    lines = text.splitlines(keepends=True)
    if owner is not None:
        # the signature keeps its continuation lines' indentation; the body loses two
        sig = _signature_lines(lines)
        lines = [ln[2:] if (i == 0 or i >= sig) and ln.startswith("  ") else ln for i, ln in enumerate(lines)]
        if lines:
            first = lines[0]
            for tail in (",", ")"):
                first = first.replace(f"(self: {owner}{tail}", f"(self{tail}", 1)
            lines[0] = first
    out = "".join(lines)
    if owner is not None:
        out = _renumber(out)
    return out if out.endswith("\n") else out + "\n"


_STRING_LIT = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
_TEMP = re.compile(r"(?<![A-Za-z0-9_.])_(\d+)(?![A-Za-z0-9_])")
_GETATTR_ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*) = [A-Za-z_][A-Za-z_0-9]*\.([A-Za-z_][A-Za-z_0-9]*)\s*$", re.M)


def _outside_strings(text: str, fn: Any) -> str:
    out = []
    pos = 0
    for m in _STRING_LIT.finditer(text):
        out.append(fn(text[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(fn(text[pos:]))
    return "".join(out)


def _renumber(text: str) -> str:
    """Undo the class-wide name counters of the printer that wrote the archive.

    torch prints a whole class with one printer, so temporaries (``_0``, ``_1`` …)
    keep counting across methods and a variable holding ``self.<attr>`` that was already
    used in an earlier method gets a higher suffix. ``.code`` prints one method with a
    fresh printer: temporaries restart at ``_0`` (same order) and ``<attr>``-named
    variables are named ``<attr>``, ``<attr>0``, ``<attr>1`` … in suffix order.
    """
    code_only = _outside_strings(text, lambda s: s)
    temps = sorted({int(m.group(1)) for m in _TEMP.finditer(_STRING_LIT.sub('""', code_only))})
    rename: dict[str, str] = {f"_{n}": f"_{i}" for i, n in enumerate(temps) if n != i}
    families: dict[str, set[str]] = {}
    for m in _GETATTR_ASSIGN.finditer(_STRING_LIT.sub('""', code_only)):
        var, attr = m.group(1), m.group(2)
        if var == attr or (var.startswith(attr) and var[len(attr) :].isdigit()):
            families.setdefault(attr, set()).add(var)
    bare = _STRING_LIT.sub('""', code_only)
    for attr, names in families.items():
        ordered = sorted(names, key=lambda n: -1 if n == attr else int(n[len(attr) :]))
        # the bare name is free unless something else (an argument) already uses it
        taken = attr not in names and re.search(r"(?<![A-Za-z0-9_.])" + re.escape(attr) + r"(?![A-Za-z0-9_])", bare) is not None
        targets = ([] if taken else [attr]) + [f"{attr}{i}" for i in range(len(ordered))]
        for n, new in zip(ordered, targets, strict=False):
            if n != new:
                rename[n] = new
    if not rename:
        return text
    ident = re.compile(
        r"(?<![A-Za-z0-9_.])(" + "|".join(re.escape(k) for k in sorted(rename, key=len, reverse=True)) + r")(?![A-Za-z0-9_])"
    )
    return _outside_strings(text, lambda s: ident.sub(lambda m: rename[m.group(1)], s))
