"""The model zoo of issue #16 run by the interpreter and by torch: each model of
``zoo_models.ZOO`` is exported with ``torch.export.export``, saved as ``.pt2``, loaded by
torchless and run in the training IR and after ``run_decompositions()`` (the core ATen IR);
outputs (and, for BatchNorm in train mode, the running statistics the program mutates) must
match torch's unlifted module on the same inputs.

Tolerances: float32 outputs rtol 1e-4 / atol 1e-5 (``ZooCase.rtol``/``atol``; torch runs
its convolutions and matmuls through oneDNN/MKL with another summation order), integer and
boolean outputs exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import torchless

torch = pytest.importorskip("torch", reason="torch exports the zoo and is the oracle")

from .zoo_models import ZOO, build, dynamic_shapes  # noqa: E402

CASES = {c.name: c for c in ZOO}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (case, torch module, example inputs, {ir: (path, ExportedProgram)})."""
    d = tmp_path_factory.mktemp("zoo")
    out = {}
    for case in ZOO:
        m, args = build(case)
        ep = torch.export.export(m, args, dynamic_shapes=dynamic_shapes(case))
        progs = {}
        for ir, prog in (("training", ep), ("aten", ep.run_decompositions())):
            path = d / f"{case.name}_{ir}.pt2"
            torch.export.save(prog, path)
            progs[ir] = (path, prog)
        out[case.name] = (case, m, args, progs)
    return out


def _np(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t


def _compare(ours, theirs, case, what):
    theirs = torch.utils._pytree.tree_map(_np, theirs)
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), f"{what}: {len(theirs)} outputs"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _compare(a, b, case, f"{what}[{i}]")
        return
    assert isinstance(ours, np.ndarray), f"{what}: {type(ours)}"
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (
        f"{what}: {ours.shape} {ours.dtype} != {theirs.shape} {theirs.dtype}"
    )
    if theirs.dtype.kind in "fc":
        np.testing.assert_allclose(ours, theirs, rtol=case.rtol, atol=case.atol, err_msg=what)
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=what)


def _inputs_for(case, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(case.inputs(g))


@pytest.mark.parametrize("ir", ["training", "aten"])
@pytest.mark.parametrize("name", [c.name for c in ZOO])
def test_zoo_model_matches_torch(exported, name, ir):
    case, _model, args, progs = exported[name]
    path, ep = progs[ir]
    ours = torchless.load(path).module()
    theirs = torch.export.load(path).module()  # fresh buffers (the two IRs' programs share the export's)
    for seed in (1, 2):  # the example inputs, then fresh ones (a second call: buffers carried over)
        x = args if seed == 1 else _inputs_for(case, 100 + seed)
        got = ours(*(a.numpy() for a in x))
        ref = theirs(*(a.clone() for a in x))
        _compare(got, ref, case, f"{name} ({ir} IR) output")
        if case.train:  # the running statistics the program mutates
            tb = dict(theirs.named_buffers())
            assert set(ours.buffers) == set(tb)
            for k in tb:
                _compare(ours.buffers[k], tb[k], case, f"{name} ({ir} IR) buffer {k}")


@pytest.mark.parametrize("ir", ["training", "aten"])
def test_dynamic_batch_and_sequence(exported, ir):
    case, _model, _args, progs = exported["dynamic"]
    path, ep = progs[ir]
    ours = torchless.load(path).module()
    for b, s in ((1, 2), (7, 33), (64, 128)):
        x = torch.randn(b, s, 32, generator=torch.Generator().manual_seed(b * s))
        _compare(ours(x.numpy()), ep.module()(x), case, f"dynamic ({ir} IR) at batch {b}, seq {s}")
    with pytest.raises(torchless.UsageError):
        ours(np.zeros((65, 4, 32), np.float32))


def test_training_ir_keeps_the_nn_ops_whole(exported):
    """The training IR exercises the composite kernels (conv2d, batch_norm, lstm, sdpa...),
    the ATen IR the core ones: both are really different programs."""
    hist = {ir: set() for ir in ("training", "aten")}
    for _case, _m, _a, progs in exported.values():
        for ir, (path, _ep) in progs.items():
            hist[ir] |= set(torchless.load(path).op_histogram())
    assert {"aten.conv2d.default", "aten.lstm.input", "aten.scaled_dot_product_attention.default"} <= hist["training"]
    assert {"aten.convolution.default", "aten._native_batch_norm_legit_no_training.default"} <= hist["aten"]
    assert "aten.conv2d.default" not in hist["aten"]
