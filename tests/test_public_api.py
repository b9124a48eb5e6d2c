"""``torchless.__all__`` is the public surface: every name in it exists and is documented,
and every public name the package binds is in it (as httpx's ``test_exported_members``)."""

from __future__ import annotations
import __future__

import pathlib
import re
import types

import torchless

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _public_bindings(mod: types.ModuleType) -> set[str]:
    """Names a package binds that are neither private, nor submodules, nor ``from __future__``."""
    out = set()
    for name, value in vars(mod).items():
        if name.startswith("_") or isinstance(value, (types.ModuleType, __future__._Feature)):
            continue
        out.add(name)
    return out


def _python_api_section() -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(r"^## Python API\n(.*?)^## ", text, re.S | re.M)
    assert m, "README.md has no '## Python API' section"
    return m.group(1)


def test_all_names_exist_and_have_docstrings():
    assert len(set(torchless.__all__)) == len(torchless.__all__), "duplicates in __all__"
    assert torchless.__all__ == sorted(torchless.__all__, key=lambda n: (n[0].islower(), n)), "keep __all__ sorted"
    for name in torchless.__all__:
        value = getattr(torchless, name)  # lazy names (scan) resolve too
        assert (getattr(value, "__doc__", None) or "").strip(), f"torchless.{name} has no docstring"


def test_every_public_name_is_in_all():
    import torchless.scan  # noqa: F401 - a lazy export, bound once used

    extra = _public_bindings(torchless) - set(torchless.__all__)
    assert not extra, f"public names missing from torchless.__all__ (or make them private): {sorted(extra)}"


def test_all_is_documented_in_the_readme():
    section = _python_api_section()
    missing = [n for n in torchless.__all__ if f"`{n}`" not in section and f"torchless.{n}" not in section]
    assert not missing, f"README.md '## Python API' does not document: {missing}"


def test_the_guard_can_fail():
    fake = types.ModuleType("fake")
    exec("from __future__ import annotations\nimport os\nfrom os import path as _p\nhelper = 1\ndef f(): pass\n", vars(fake))
    assert _public_bindings(fake) == {"helper", "f"}
