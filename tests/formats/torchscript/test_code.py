"""Pure tests (no torch): the code/ parser, .code rendering, storage names, the resolver."""

from __future__ import annotations

import pytest

from torchless.core.errors import UnsafeGlobalError
from torchless.core.tensor import Storage
from torchless.formats.torchscript import spec
from torchless.formats.torchscript.code import method_code, parse_code_file
from torchless.formats.torchscript.read import ScriptObject, TorchScriptResolver
from torchless.pickle.machine import Unpickler

SOURCE = """class M(Module):
  __parameters__ = ["w", ]
  __buffers__ = ["b", ]
  w : Tensor
  b : Tensor
  training : bool
  __annotations__["0"] = __torch__.Sub
  k : Final[int] = 3
  def forward(self: __torch__.M,
    x: Tensor) -> Tensor:
    _0 = "a string with _1 inside"
    w = self.w
    return torch.add(x, w)
  def other(self: __torch__.M) -> Tensor:
    _1 = uninitialized(Tensor)
    w0 = self.w
    w1 = self.w
    if bool(_1):
      _2 = w0
    else:
      _2 = w1
    return _2
def helper(x: Tensor) -> Tensor:
  return x
"""


def test_parse_code_file():
    cf = parse_code_file("code/__torch__.py", "__torch__", SOURCE)
    m = cf.classes["M"]
    assert m.qualified_name == "__torch__.M" and m.is_module
    assert m.parameters == ["w"] and m.buffers == ["b"]
    assert m.attributes == {"w": "Tensor", "b": "Tensor", "training": "bool", "0": "__torch__.Sub"}
    assert m.constants == ["k"]
    assert list(m.methods) == ["forward", "other"]
    assert list(cf.functions) == ["helper"] and cf.functions["helper"].code == "def helper(x: Tensor) -> Tensor:\n  return x\n"


def test_method_code_like_torch():
    m = parse_code_file("code/__torch__.py", "__torch__", SOURCE).classes["M"]
    assert m.methods["forward"].code == (
        'def forward(self,\n    x: Tensor) -> Tensor:\n  _0 = "a string with _1 inside"\n  w = self.w\n  return torch.add(x, w)\n'
    )
    # class-wide counters restart per method; strings are left alone
    assert m.methods["other"].code == (
        "def other(self) -> Tensor:\n  _0 = uninitialized(Tensor)\n  w = self.w\n  w0 = self.w\n"
        "  if bool(_0):\n    _1 = w\n  else:\n    _1 = w0\n  return _1\n"
    )
    assert method_code("def f(x: int) -> int:\n  return x\n", None) == "def f(x: int) -> int:\n  return x\n"


def test_storage_names():
    assert spec.storage_dtype("UInt16Storage").name == "uint16"
    assert spec.storage_dtype("Float8_e4m3fnStorage").name == "float8_e4m3fn"
    assert spec.storage_dtype("ComplexHalfStorage").name == "complex32"
    assert spec.storage_dtype("BFloat16Storage").name == "bfloat16"
    assert spec.storage_dtype("NoSuchStorage") is None
    assert spec.code_record_for("__torch__.torch.nn.modules.linear.Linear") == (
        "code/__torch__/torch/nn/modules/linear.py",
        "Linear",
    )
    assert spec.module_of_code_record("code/__torch__/a/b.py") == "__torch__.a.b"


def _run(data: bytes, weights_only: bool = True):
    def pl(pid):
        stype = pid[1]
        return Storage(pid[2], pid[4] * stype.dtype.itemsize, stype.dtype, data=bytes(pid[4] * stype.dtype.itemsize))

    return Unpickler(data, resolver=TorchScriptResolver(weights_only), persistent_load=pl).load()


def test_resolver_cpp_pickler_names():
    # GLOBAL '__torch__ M' ) NEWOBJ } ( 'v' <uint16 tensor> 'l' build_intlist([1,2]) u b .
    tensor = (
        b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nUInt16Storage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x03tQ"
        b"K\x00(K\x03t(K\x01t\x89ccollections\nOrderedDict\n)RtR"
    )
    intlist = b"ctorch.jit._pickle\nbuild_intlist\n(]q\x00(K\x01K\x02etR"
    tagged = b"ctorch.jit._pickle\nrestore_type_tag\nX\x01\x00\x00\x00aX\x09\x00\x00\x00List[str]\x86R"
    data = (
        b"\x80\x02c__torch__\nM\n)\x81}(X\x01\x00\x00\x00v"
        + tensor
        + b"X\x01\x00\x00\x00l"
        + intlist
        + b"X\x01\x00\x00\x00s"
        + tagged
        + b"ub."
    )
    obj = _run(data)
    assert isinstance(obj, ScriptObject) and obj.qualified_name == "__torch__.M"
    assert obj.v.dtype.name == "uint16" and obj.v.shape == (3,)
    assert obj.l == [1, 2] and obj.s == "a"


def test_resolver_refuses_other_globals():
    with pytest.raises(UnsafeGlobalError):
        _run(b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R.")
    with pytest.raises(UnsafeGlobalError):  # not an identity helper torch archives use
        _run(b"\x80\x02ctorch.jit._pickle\nbuild_tensor_from_id\nK\x01\x85R.")


def test_enum_member_reduce():
    # the C++ pickler writes enum members as GLOBAL '__torch__ <Enum>' <value> REDUCE
    obj = _run(b"\x80\x02c__torch__\nColor\nK\x02R.")
    assert isinstance(obj, ScriptObject) and obj.value == 2 and obj.qualified_name == "__torch__.Color"
