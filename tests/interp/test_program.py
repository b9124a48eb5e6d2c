"""Exported programs run in torchless and in torch give the same outputs: ``Program.module()``,
``Program.run``, control flow (cond, while_loop, map, scan), buffer mutation in the training
IR and after ``run_decompositions()``, dynamic dims and their guards, refusal of a program
with unsupported operators before anything runs, the ``run`` command, and ``.pt2`` files
whose weights and operators torchless replaced (saved by torchless, run by torch and by torchless).
The ATen kernels are the real ones (``interp/kernels``); only the test's own custom
operators get NumPy kernels here.
"""

from __future__ import annotations

import dataclasses
import json
from collections import namedtuple
from unittest import mock

import numpy as np
import pytest

import torchless
from torchless.cli.main import main
from torchless.cli.schemas import SCHEMAS, validate
from torchless.core.errors import UnsupportedError, UsageError
from torchless.interp import registry

torch = pytest.importorskip("torch", reason="torch exports the programs and is the oracle")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


class While(torch.nn.Module):
    def forward(self, i, x):
        from torch._higher_order_ops import while_loop

        return while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x * 2), (i, x))


class Map(torch.nn.Module):
    def forward(self, xs, y):
        from torch._higher_order_ops import map as hop_map

        return hop_map(lambda x, y: x * y + 1, xs, y)


class Scan(torch.nn.Module):
    def forward(self, xs):
        from torch._higher_order_ops.scan import scan

        def combine(c, x):
            n = c + x
            return n, n * 2

        return scan(combine, torch.zeros(3), xs)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(2))

    def forward(self, x, *, scale):
        self.total.add_(x.sum())
        return {"y": x * scale, "n": [x.shape[0] * 2]}


class NoGrad(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            y = x * 2
        with torch.autocast("cpu", enabled=False):
            z = y * 3
        return z + 1


class Derived(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y]) * 2


@torch.library.custom_op("tl_interp_test::add_one_", mutates_args=("x",))
def add_one_(x: torch.Tensor) -> None:
    x.add_(1)


@torch.library.custom_op("tl_interp_test::scale", mutates_args=("y",))
def scale_(x: torch.Tensor, y: torch.Tensor, k: float) -> torch.Tensor:
    y.mul_(k)
    return x * k


@scale_.register_fake
def _scale_fake(x, y, k):
    return torch.empty_like(x)


def _add_one_kernel(x):
    np.add(x, 1, out=x)


def _scale_kernel(x, y, k):
    np.multiply(y, k, out=y, casting="unsafe")
    return np.asarray(x * np.float32(k))


class Mutating(torch.nn.Module):
    """A custom op mutating a slice of a buffer, an in-place op on a user input, a custom op
    mutating another user input: mutations in place (training IR) or through
    auto_functionalized_v2 and USER_INPUT_MUTATION outputs (ATen IR)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.ones(4))

    def forward(self, x, z):
        add_one_(self.b[1:3])
        x.add_(2)
        return scale_(x, z, 3.0) + self.b.sum()


class Ints(torch.nn.Module):
    def forward(self, x, n: int, f: float = 2.0):
        return x * n + x.shape[0], n + 1


class Autocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.lin(x)  # a lower-precision op: bfloat16
            z = torch.cat([y, x])  # a promote op: float32
            loss = torch.nn.functional.mse_loss(y, x)  # an fp32 op
            w = y * 2  # no policy: stays bfloat16
        return y, z, loss, w


class SymOps(torch.nn.Module):
    """SymInt arithmetic (``//``, ``%``, neg, sym_max, sym_float, sym_int, sym_sqrt) and a
    program whose ``guards_code`` excludes some sizes (``max(1, n // 2) != 1``)."""

    def forward(self, x):
        n = x.shape[0]
        a = torch.sym_max(n // 2, 1)
        c = torch.sym_int(torch.sym_float(n) * 0.5)
        return x[:a].sum() + (n // 3 + 1) + c, n % 3, -n, torch.sym_sqrt(n)


Pair = namedtuple("Pair", ["a", "b"])
torch.utils._pytree._register_namedtuple(Pair, serialized_type_name="tl_interp_test.Pair")


class Nested(torch.nn.Module):
    def forward(self, xs, d, *, scale=2.0):
        a, b = xs
        return Pair(a * scale + d["k"], [b - d["j"], {"z": a.sum()}])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    mask: torch.Tensor | None


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    extra: torch.Tensor | None
    mean: torch.Tensor


torch.utils._pytree.register_dataclass(Batch, serialized_type_name="tl_interp_test.Batch")
torch.utils._pytree.register_dataclass(Result, serialized_type_name="tl_interp_test.Result")


class ModelOutput(dict):
    """A mapping output registered the way Hugging Face registers ModelOutput: the values
    are the children, the keys the context."""

    def __getattr__(self, name):
        return self[name]


torch.utils._pytree.register_pytree_node(
    ModelOutput,
    lambda o: (list(o.values()), list(o.keys())),
    lambda values, keys: ModelOutput(zip(keys, values, strict=True)),
    serialized_type_name="tl_interp_test.ModelOutput",
)


class Boxed:
    def __init__(self, v, scale):
        self.v, self.scale = v, scale


torch.utils._pytree.register_pytree_node(
    Boxed,
    lambda b: ([b.v], {"scale": b.scale}),
    lambda values, ctx: Boxed(values[0], ctx["scale"]),
    serialized_type_name="tl_interp_test.Boxed",
)


class Mapping(torch.nn.Module):
    def forward(self, x):
        return ModelOutput(logits=x * 2, hidden=x + 1)


class Odd(torch.nn.Module):
    def forward(self, x):
        return Boxed(x * 2, 3)


class Dataclasses(torch.nn.Module):
    def forward(self, batch):
        y = batch.x * 2
        return Result(y, None, y.mean()), Pair(batch.x + 1, batch.x - 1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (path of the .pt2, the ExportedProgram): each model exported once."""
    d = tmp_path_factory.mktemp("interp")
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=16)
    cases = {
        "mlp": (MLP(), (torch.randn(2, 4),), {}, {"x": {0: batch}}),
        "cond": (Cond(), (torch.randn(3),), {}, None),
        "while": (While(), (torch.tensor(0), torch.ones(2)), {}, None),
        "map": (Map(), (torch.randn(3, 2), torch.randn(2)), {}, None),
        "scan": (Scan(), (torch.randn(4, 3),), {}, None),
        "nograd": (NoGrad(), (torch.randn(3),), {}, None),
        "derived": (Derived(), (torch.randn(4, 2), torch.randn(8, 2)), {}, {"x": {0: batch}, "y": {0: 2 * batch}}),
        "ints": (Ints(), (torch.ones(2), 3, 2.0), {}, {"x": None, "n": torch.export.Dim.DYNAMIC, "f": None}),
        "autocast": (Autocast(), (torch.randn(2, 4),), {}, None),
        "symops": (SymOps(), (torch.randn(7, 2),), {}, {"x": {0: torch.export.Dim.AUTO}}),
        "nested": (
            Nested(),
            ((torch.randn(3), torch.randn(3)), {"k": torch.randn(3), "j": torch.randn(3)}),
            {"scale": 2.0},
            None,
        ),
        "dataclasses": (Dataclasses(), (Batch(torch.randn(3), None),), {}, None),
        "mapping": (Mapping(), (torch.randn(3),), {}, None),
        "odd": (Odd(), (torch.randn(3),), {}, None),
        "mutating": (Mutating(), (torch.ones(4), torch.ones(4)), {}, None),
        "counter": (Counter(), (torch.randn(4, 2),), {"scale": torch.tensor(3.0)}, {"x": {0: batch}, "scale": None}),
    }
    out = {}
    for name, (m, args, kwargs, dyn) in cases.items():
        ep = torch.export.export(m, args, kwargs, dynamic_shapes=dyn)
        for tag, prog in (
            ("", ep),
            ("_dec", ep.run_decompositions()) if name in ("mlp", "counter", "cond", "mutating") else (None, None),
        ):
            if tag is None:
                continue
            path = d / f"{name}{tag}.pt2"
            torch.export.save(prog, path)
            out[name + tag] = (path, prog)
    # auto_functionalized v1: what export made before v2, and still makes with this switch off
    with mock.patch.object(torch._export.config, "enable_auto_functionalized_v2_for_export", False):
        prog = torch.export.export(Mutating(), (torch.ones(4), torch.ones(4))).run_decompositions()
    torch.export.save(prog, d / "mutating_v1.pt2")
    out["mutating_v1"] = (d / "mutating_v1.pt2", prog)
    return out


def _np(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t


def _check(ours, theirs, rtol=1e-5, atol=1e-6):
    theirs = torch.utils._pytree.tree_map(_np, theirs)
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _check(a, b, rtol, atol)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for k in theirs:
            _check(ours[k], theirs[k], rtol, atol)
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)
    else:
        assert ours == theirs


@pytest.mark.parametrize("name", ["mlp", "mlp_dec"])
def test_mlp_matches_torch_with_a_dynamic_batch(saved, name):
    path, ep = saved[name]
    m = torchless.load(path).module()
    for n in (1, 2, 5, 16):  # 1: below the Dim's min of 2, which torch does not check
        x = torch.randn(n, 4)
        _check(m(x.numpy()), ep.module()(x))
    x = torch.randn(3, 4)
    _check(m(x.numpy().astype(">f4")), ep.module()(x))  # big-endian input
    _check(m(x.clone().requires_grad_()), ep.module()(x))  # a torch tensor that requires grad
    with pytest.raises(UsageError, match=r"x\.shape\[0\].*(<= 16|\b17\b)") as e:
        m(np.zeros((17, 4), np.float32))
    assert "17" in str(e.value)
    with pytest.raises(Exception, match="17|<= 16"):
        ep.module()(torch.zeros(17, 4))  # torch refuses it too
    with pytest.raises(UsageError, match=r"x\.shape\[1\]"):
        m(np.zeros((3, 5), np.float32))
    with pytest.raises(UsageError, match="dtype"):
        m(np.zeros((3, 4)))  # float64


@pytest.mark.parametrize("name", ["cond", "cond_dec"])
def test_cond_takes_either_branch(saved, name):
    path, ep = saved[name]
    prog = torchless.load(path)
    for x in (torch.ones(3), -torch.ones(3), torch.randn(3)):
        _check(prog.run(x.numpy()), ep.module()(x))


def test_while_loop(saved):
    path, ep = saved["while"]
    m = torchless.load(path).module()
    for i in (0, 3, 7):
        args = (torch.tensor(i), torch.arange(2, dtype=torch.float32))
        _check(m(*(a.numpy() for a in args)), ep.module()(*args))


def test_grad_and_autocast_wrappers_run_their_subgraphs(saved):
    path, ep = saved["nograd"]
    prog = torchless.load(path)
    assert {"higher_order.wrap_with_set_grad_enabled", "higher_order.wrap_with_autocast"} <= set(prog.op_histogram())
    x = torch.randn(3)
    _check(prog.module()(x.numpy()), ep.module()(x))


def test_enabled_cpu_autocast_casts_like_torch(saved, monkeypatch):
    if registry.lookup("aten.broadcast_tensors.default") is None:  # mse_loss's training IR; not a core op
        monkeypatch.setitem(registry._KERNELS, "aten.broadcast_tensors.default", lambda ts: list(np.broadcast_arrays(*ts)))
    path, ep = saved["autocast"]
    x = torch.randn(2, 4)
    ours, theirs = torchless.load(path).module()(x.numpy()), ep.module()(x)
    assert [str(o.dtype) for o in ours] == [str(t.dtype).replace("torch.", "") for t in theirs]
    assert [str(o.dtype) for o in ours] == ["bfloat16", "float32", "float32", "bfloat16"]
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.astype(np.float32), b.detach().float().numpy(), rtol=1e-2, atol=1e-2)


def test_derived_dims_are_checked(saved):
    path, ep = saved["derived"]
    m = torchless.load(path).module()
    x, y = torch.randn(3, 2), torch.randn(6, 2)
    _check(m(x.numpy(), y.numpy()), ep.module()(x, y))
    with pytest.raises(UsageError, match=r"y\.shape\[0\] must equal 2\*") as e:
        m(x.numpy(), np.zeros((7, 2), np.float32))
    assert "expected 6, found 7" in str(e.value)
    with pytest.raises(Exception):  # noqa: B017 - torch raises its own error type
        ep.module()(x, torch.zeros(7, 2))


def test_symint_and_constant_inputs(saved):
    path, ep = saved["ints"]
    m = torchless.load(path).module()
    for n in (3, 7):
        _check(m(np.ones(2, np.float32), n, 2.0), ep.module()(torch.ones(2), n, 2.0))
    with pytest.raises(UsageError, match="input f must equal the value"):
        m(np.ones(2, np.float32), 3, 2.5)
    with pytest.raises(Exception, match="f == 2.0"):
        ep.module()(torch.ones(2), 3, 2.5)


def test_symint_arithmetic_and_guards_code(saved):
    path, ep = saved["symops"]
    prog = torchless.load(path)
    assert prog.guards_code  # the program carries Python guards over its inputs
    m = prog.module()
    for n in (7, 31):
        x = torch.randn(n, 2)
        _check(m(x.numpy()), ep.module()(x))
    assert m.unchecked_guards == []
    for n in (2, 3):  # n // 2 == 1: outside what the program was exported for
        with pytest.raises(UsageError, match=r"guard.*x\.size\(\)\[0\] // 2"):
            m(np.zeros((n, 2), np.float32))
        with pytest.raises(AssertionError, match="Guard failed"):
            ep.module()(torch.zeros(n, 2))


def test_nested_inputs_and_outputs_follow_the_tree_specs(saved):
    path, ep = saved["nested"]
    m = torchless.load(path).module()
    xs, d = (torch.randn(3), torch.randn(3)), {"j": torch.randn(3), "k": torch.randn(3)}  # another key order
    ours = m(tuple(t.numpy() for t in xs), {k: v.numpy() for k, v in d.items()}, scale=2.0)
    theirs = ep.module()(xs, d, scale=2.0)
    _check(ours, theirs)
    # the namedtuple is rebuilt with its name and fields (the program's treespec_namedtuple_fields)
    assert type(theirs).__name__ == type(ours).__name__ == "Pair" and ours._fields == theirs._fields == ("a", "b")
    assert isinstance(ours.b[1], dict) and list(ours.b[1]) == ["z"]
    with pytest.raises(UsageError, match="args has the wrong length"):
        m(xs, d, None, scale=2.0)
    with pytest.raises(UsageError, match=r"d has the wrong keys"):
        m(xs, {"k": d["k"]}, scale=2.0)


def test_map(saved):
    path, ep = saved["map"]
    m = torchless.load(path).module()
    xs, y = torch.randn(3, 2), torch.randn(2)
    _check(m(xs.numpy(), y.numpy()), ep.module()(xs, y))


def test_scan(saved):
    path, ep = saved["scan"]
    m = torchless.load(path).module()
    xs = torch.randn(4, 3)
    _check(m(xs.numpy()), ep.module()(xs))


@pytest.mark.parametrize("name", ["counter", "counter_dec"])
def test_buffer_mutation_updates_the_modules_buffers(saved, name):
    path, ep = saved[name]
    prog = torchless.load(path)
    ours, theirs = prog.module(), torch.export.load(path).module()  # a fresh buffer (ep's are shared)
    for n in (4, 3):
        x = torch.randn(n, 2)
        # kwargs by name, a torchless Tensor as an input, an int inside the output pytree
        _check(
            ours(torchless.Tensor.from_numpy(x.numpy()), scale=np.float32(3.0) * np.ones((), np.float32)),
            theirs(x, scale=torch.tensor(3.0)),
        )
        np.testing.assert_allclose(ours.buffers["total"], theirs.total.numpy(), rtol=1e-5, atol=1e-6)
    assert prog.module().buffers["total"].tolist() == [0.0, 0.0]  # a new module starts from the stored buffers
    with pytest.raises(UsageError, match="keys"):
        ours(np.ones((4, 2), np.float32))


_CUSTOM = {
    "tl_interp_test.add_one_.default": (_add_one_kernel, ("x",)),
    "tl_interp_test.scale.default": (_scale_kernel, ("y",)),
}


@pytest.mark.parametrize("name", ["mutating", "mutating_dec", "mutating_v1"])
def test_mutations_of_inputs_buffers_and_views(saved, name, monkeypatch):
    for key, (fn, mutates) in _CUSTOM.items():
        if registry.lookup(key) is None:
            monkeypatch.setitem(registry._KERNELS, key, fn)
            monkeypatch.setitem(registry._MUTATES, key, mutates)  # what kernel(key, mutates=...) records
    path, _ep = saved[name]
    prog = torchless.load(path)
    if name.endswith("_dec"):
        assert "higher_order.auto_functionalized_v2" in prog.op_histogram()
    if name.endswith("_v1"):
        hist = prog.op_histogram()
        assert hist.get("higher_order.auto_functionalized") == 2 and "higher_order.auto_functionalized_v2" not in hist
    ours, theirs = prog.module(), torch.export.load(path).module()
    for _ in range(2):
        x, z = torch.randn(4), torch.randn(4)
        xn, zn = x.numpy().copy(), z.numpy().copy()
        _check(ours(xn, zn), theirs(x, z))
        np.testing.assert_allclose(xn, x.numpy(), rtol=1e-5, atol=1e-6)  # the caller's arrays are mutated like torch's tensors
        np.testing.assert_allclose(zn, z.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours.buffers["b"], theirs.b.numpy())


def test_missing_kernels_refused_before_running(saved, monkeypatch):
    path, _ep = saved["counter"]
    prog = torchless.load(path)
    for k in ("aten.mul.Tensor", "aten.sum.default"):
        monkeypatch.delitem(registry._KERNELS, k, raising=False)
    with pytest.raises(UnsupportedError) as e:
        prog.module()
    assert "aten.mul.Tensor" in str(e.value) and "aten.sum.default" in str(e.value) and "2 operators" in str(e.value)


def test_cli_run(saved, tmp_path, capsys):
    path, ep = saved["mlp"]
    x = torch.randn(3, 4)
    np.savez(tmp_path / "in.npz", arg0=x.numpy())
    out = tmp_path / "out.npz"
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    want = ep.module()(x).detach().numpy()
    assert "out" in text and "float32" in text and "[3, 3]" in text
    with np.load(out) as z:
        np.testing.assert_allclose(z["out"], want, rtol=1e-5, atol=1e-6)
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    validate(res, SCHEMAS["run"])
    (row,) = res["outputs"]
    assert row["shape"] == [3, 3] and row["dtype"] == "float32"
    assert row["max"] == pytest.approx(float(want.max()), rel=1e-5) and row["mean"] == pytest.approx(float(want.mean()), rel=1e-4)
    np.savez(tmp_path / "bad.npz", arg0=np.zeros((3, 4)))
    assert main(["run", str(path), "--inputs", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "dtype" in err


def test_cli_run_sample_inputs(saved, capsys):
    path, ep = saved["counter"]
    assert main(["run", str(path), "--sample-inputs", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in res["outputs"]] == ["out['y']", "out['n'][0]"]
    assert res["outputs"][1]["min"] == 8  # x.shape[0] * 2 for the (4, 2) sample


def test_an_edited_graph_runs_as_edited(saved):
    from torchless.graph.ir import OpRef

    path, ep = saved["mlp"]
    prog = torchless.load(path)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    before = prog.module()(x)
    (relu,) = [n for n in prog.graph.nodes if str(n.target) == "aten.relu.default"]
    relu.target = OpRef("aten.sigmoid.default")  # a replaced op: the next module runs it
    after = prog.module()(x)
    sd = {k: v.numpy() for k, v in prog.state_dict.items()}
    h = x @ sd["l1.weight"].T + sd["l1.bias"]
    np.testing.assert_allclose(after, (1 / (1 + np.exp(-h))) @ sd["l2.weight"].T + sd["l2.bias"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(before, np.maximum(h, 0) @ sd["l2.weight"].T + sd["l2.bias"], rtol=1e-5, atol=1e-6)


def test_edited_weights_run_the_same_in_torch_and_torchless(saved, tmp_path):
    from torchless.formats.pt2 import save_pt2

    path, _ep = saved["mlp"]
    prog = torchless.load(path)
    rng = np.random.default_rng(0)
    for k in list(prog.state_dict):
        shape = prog.state_dict[k].shape
        prog.state_dict[k] = torchless.Tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
    new = tmp_path / "edited.pt2"
    save_pt2(new, prog)
    x = torch.randn(5, 4)
    theirs = torch.export.load(new).module()(x)
    ours = torchless.load(new).module()(x.numpy())
    _check(ours, theirs)
    assert not np.allclose(ours, saved["mlp"][1].module()(x).detach().numpy())  # the new weights count


def test_cli_run_keyword_inputs_and_errors(saved, tmp_path, capsys):
    path, _ep = saved["counter"]
    np.savez(tmp_path / "in.npz", arg0=np.ones((3, 2), np.float32), scale=np.asarray(2.5, np.float32))
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in res["inputs"]] == ["arg0", "scale"]
    assert res["outputs"][0]["max"] == 2.5 and res["outputs"][1]["min"] == 6
    np.savez(tmp_path / "gap.npz", arg1=np.ones((3, 2), np.float32))
    for argv in (
        ["run", str(path), "--inputs", str(tmp_path / "gap.npz")],  # arg1 without arg0
        ["run", str(path)],  # neither --inputs nor --sample-inputs
        ["run", str(tmp_path / "in.npz"), "--sample-inputs"],  # not a .pt2
        ["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--model", "nope"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("start", [0, 2, 5])
def test_while_loop_stack_output_matches_torch(start):
    """``while_loop_stack_output`` (the loop autograd records) stacks every iteration's carried
    values; with no iteration, the initial values with a leading dimension of 1."""
    from torch._higher_order_ops.while_loop import while_loop_stack_output_op

    def cond(i, x, w):
        return i < 4

    def body(i, x, w):
        return i + 1, x @ w

    i0, x0, w = torch.tensor(start), torch.randn(2, 3), torch.randn(3, 3)
    want = while_loop_stack_output_op(cond, body, (i0, x0), (w,))

    def np_cond(i, x, w):
        return np.asarray(i < 4)

    def np_body(i, x, w):
        return np.asarray(i + 1), x @ w

    got = registry.require("higher_order.while_loop_stack_output")(np_cond, np_body, (i0.numpy(), x0.numpy()), (w.numpy(),))
    _check(tuple(got), tuple(want))


def test_dataclass_inputs_and_outputs_keep_their_fields(saved):
    """A ``register_dataclass`` input is flattened by its fields; a dataclass output comes back
    as a namedtuple of its class name and fields (a field that was None stays None), a
    namedtuple output with its fields: what torch's module returns, field for field."""
    path, ep = saved["dataclasses"]
    m = torchless.load(path).module()
    x = torch.randn(3)
    ours = m(Batch(x.numpy(), None))
    theirs = ep.module()(Batch(x, None))
    res, pair = ours
    assert type(res).__name__ == "Result" and res._fields == ("logits", "mean", "extra")
    assert res.extra is None and theirs[0].extra is None
    for f in ("logits", "mean"):
        _check(getattr(res, f), getattr(theirs[0], f))
    assert type(pair).__name__ == "Pair" and pair._fields == ("a", "b")
    _check(pair.a, theirs[1].a)
    _check(pair.b, theirs[1].b)
    _check(m({"x": x.numpy(), "mask": None})[1].a, theirs[1].a)  # a mapping of the fields works too
    with pytest.raises(UsageError, match="must have the fields x"):
        m((x.numpy(),))


def test_auto_functionalized_v1_needs_the_mutated_arguments(saved, monkeypatch):
    """A custom operator's schema is not in the .pt2: without its kernel's ``mutates``
    declaration, auto_functionalized (v1) cannot tell which results are the mutated
    arguments, and refuses by name instead of guessing."""
    for key, (fn, _mutates) in _CUSTOM.items():
        if registry.lookup(key) is None:
            monkeypatch.setitem(registry._KERNELS, key, fn)
        monkeypatch.delitem(registry._MUTATES, key, raising=False)
    m = torchless.load(saved["mutating_v1"][0]).module()
    with pytest.raises(UnsupportedError, match=r"auto_functionalized of tl_interp_test\.add_one_\.default.*mutates="):
        m(np.ones(4, np.float32), np.ones(4, np.float32))
    # an ATen operator's mutable arguments come from its schema
    assert registry.mutable_args("aten.add_.Tensor") == ("self",)
    assert registry.mutable_args("aten.add.Tensor") == ()


@pytest.mark.parametrize("name", ["mlp", "mlp_dec"])
def test_edited_weights_and_op_run_the_same_in_torch_and_torchless(saved, tmp_path, name):
    """A .pt2 whose weights torchless replaced and whose relu it replaced by sigmoid, saved by
    torchless: torch 2.13 loads and runs the edited file, and torchless gives its outputs;
    both computed the edit (checked against the formula with the new weights)."""
    from torchless.formats.pt2 import save_pt2
    from torchless.graph.ir import OpRef

    path, _ep = saved[name]
    prog = torchless.load(path)
    rng = np.random.default_rng(2)
    new_sd = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in prog.state_dict.items()}
    for k, v in new_sd.items():
        prog.state_dict[k] = torchless.Tensor.from_numpy(v)
    (relu,) = [n for n in prog.graph.nodes if str(n.target) == "aten.relu.default"]
    relu.target = OpRef("aten.sigmoid.default")
    new = tmp_path / "edited.pt2"
    save_pt2(new, prog)
    edited = torch.export.load(new)
    targets = [str(n.target) for n in edited.graph.nodes if n.op == "call_function"]
    assert "aten.sigmoid.default" in targets and "aten.relu.default" not in targets
    for n in (2, 7):
        x = torch.randn(n, 4)
        theirs = edited.module()(x)
        ours = torchless.load(new).module()(x.numpy())
        _check(ours, theirs)
        h = x.numpy() @ new_sd["l1.weight"].T + new_sd["l1.bias"]
        want = (1 / (1 + np.exp(-h))) @ new_sd["l2.weight"].T + new_sd["l2.bias"]
        np.testing.assert_allclose(theirs.detach().numpy(), want, rtol=1e-5, atol=1e-6)


class NonCore(torch.nn.Module):
    """Operators the training IR keeps that are not core ATen: Tensor.to, .T, cummax/cummin,
    searchsorted/bucketize, shifts, complex views, var_mean/std, logcumsumexp, broadcast_tensors."""

    def forward(self, x, seq, i):
        a = x.to(torch.float16).to(torch.float32) + x.T.T
        b = torch.cummax(x, 1).values + torch.cummin(x, 0).indices
        c = torch.searchsorted(seq, x) + torch.bucketize(x, seq, right=True)
        d = (i << 3) + (i >> 1) + torch.bitwise_left_shift(i, 2)
        z = torch.view_as_complex(torch.stack([x, a], -1).contiguous())
        e = torch.view_as_real(z * torch.complex(x, x)).sum(-1)
        v, m = torch.var_mean(x, dim=1, correction=0)
        s = torch.logcumsumexp(x, 1) + torch.std(x, 0)
        p, q = torch.broadcast_tensors(x, seq[:4])
        return a, b, c, d, e, v + m, s, p * q, x.to("cpu", torch.float64)


class ComplexParts(torch.nn.Module):
    def forward(self, x):
        z = torch.view_as_complex(x)
        return z.real * 2, z.imag + 1, torch.view_as_real(z.conj() * z), z.abs(), z.angle(), torch.polar(x[..., 0], x[..., 1])


def test_complex_parts_run_like_torch(tmp_path):
    x = torch.randn(5, 2)
    ep = torch.export.export(ComplexParts(), (x,))
    for tag, prog in (("train", ep), ("dec", ep.run_decompositions())):
        torch.export.save(prog, tmp_path / f"{tag}.pt2")
        p = torchless.load(tmp_path / f"{tag}.pt2")
        assert tag == "dec" or {"aten.real.default", "aten.imag.default", "aten._conj.default"} <= set(p.op_histogram())
        _check(p.module()(x.numpy()), prog.module()(x))


def test_non_core_operators_of_the_training_ir_run_like_torch(tmp_path):
    x, seq, i = torch.randn(3, 4), torch.linspace(-2, 2, 9), torch.randint(-50, 50, (3, 4))
    ep = torch.export.export(NonCore(), (x, seq, i))
    kept = {"aten.to.dtype", "aten.to.device", "aten.numpy_T.default", "aten.cummax.default", "aten.searchsorted.Tensor"}
    kept |= {"aten.__lshift__.Scalar", "aten.view_as_real.default", "aten.var_mean.correction", "aten.broadcast_tensors.default"}
    for tag, prog in (("train", ep), ("dec", ep.run_decompositions())):
        path = tmp_path / f"{tag}.pt2"
        torch.export.save(prog, path)
        p = torchless.load(path)
        if tag == "train":
            assert kept <= set(p.op_histogram())
        for _ in range(2):
            _check(p.module()(x.numpy(), seq.numpy(), i.numpy()), prog.module()(x, seq, i), atol=1e-5)
            x, i = torch.randn(3, 4) * 3, torch.randint(-1000, 1000, (3, 4))


def test_custom_mapping_outputs_come_back_as_mappings(saved):
    """A custom pytree type whose context is its keys (Hugging Face's ModelOutput) comes back
    as a dict of the class's name with those keys, readable as attributes too; a custom type
    with another context is refused when the module is made, before anything runs."""
    path, ep = saved["mapping"]
    x = torch.randn(3)
    ours, theirs = torchless.load(path).module()(x.numpy()), ep.module()(x)
    assert isinstance(theirs, ModelOutput) and type(ours).__name__ == "ModelOutput"
    _check(ours, dict(theirs))
    _check(ours.logits, theirs.logits)
    with pytest.raises(UnsupportedError, match="tl_interp_test.Boxed"):
        torchless.load(saved["odd"][0]).module()


@pytest.mark.parametrize("only", [None, (), ("y",)])
def test_auto_functionalized_v1_kernel_matches_torch(only, monkeypatch):
    """The v1 kernel against torch's eager auto_functionalized on the same custom operator:
    the outputs, the mutated argument's new value, and whether the caller's tensor was
    written (only when ``_only_clone_these_tensors`` leaves it out)."""
    from torchless.graph.ir import OpRef

    key = "tl_interp_test.scale.default"
    if registry.lookup(key) is None:
        monkeypatch.setitem(registry._KERNELS, key, _scale_kernel)
        monkeypatch.setitem(registry._MUTATES, key, ("y",))
    x, y = torch.randn(3), torch.randn(3)
    y0 = y.numpy().copy()
    xn, yn = x.numpy().copy(), y.numpy().copy()
    extra = {} if only is None else {"_only_clone_these_tensors": only}
    want = torch.ops.higher_order.auto_functionalized(torch.ops.tl_interp_test.scale.default, x=x, y=y, k=3.0, **extra)
    got = registry.require("higher_order.auto_functionalized")(OpRef(key), x=xn, y=yn, k=3.0, **extra)
    _check(tuple(got), tuple(want))
    np.testing.assert_allclose(yn, y.numpy(), rtol=1e-6)  # the caller's y: written exactly when torch wrote it
    assert np.array_equal(y.numpy(), y0) == (only != ())  # only an empty clone list writes the caller's y
