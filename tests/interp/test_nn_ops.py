"""Differential tests of the nn family's kernels (convolution, pooling, normalisation,
embeddings, padding, upsampling, grid sampling, dropout, attention, losses, RNNs) against
torch: every overload torchless registers for them runs in torch and in torchless on the
same inputs (``nn_oracle.check``).

Inputs come from torch's own OpInfo sample inputs (``op_db``) where an OpInfo exists,
adapted to the aten overload the functional lowers to (at most ``SAMPLES`` per op and
dtype), and from generated grids of arguments otherwise.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the differential oracle of the kernels")

from torchless.core.errors import TorchlessError  # noqa: E402
from torchless.interp import registry  # noqa: E402

from .nn_oracle import check, clone, to_np, torch_op  # noqa: E402

SAMPLES = 5
DTYPES = (torch.float32, torch.bfloat16)  # float64: the generated grids below
RED = {"none": 0, "mean": 1, "sum": 2}

# -- OpInfo samples, adapted to the aten overloads ---------------------------------------


def _conv(s, nd, transposed):
    w, b = s.args[0], s.args[1] if len(s.args) > 1 else s.kwargs.get("bias")
    kw = s.kwargs
    stride, padding, dilation, groups = kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1)
    stride, dilation = _ints(stride, nd), _ints(dilation, nd)
    padding = padding if isinstance(padding, str) else _ints(padding, nd)
    if transposed:
        op = _ints(kw.get("output_padding", 0), nd)
        key = "aten.conv_transpose1d.default" if nd == 1 else f"aten.conv_transpose{nd}d.input"
        yield key, (s.input, w, b, stride, padding, op, groups, dilation)
        yield "aten.convolution.default", (s.input, w, b, stride, padding, dilation, True, op, groups)
        return
    key = f"aten.conv{nd}d.padding" if isinstance(padding, str) else f"aten.conv{nd}d.default"
    yield key, (s.input, w, b, stride, padding, dilation, groups)
    if not isinstance(padding, str):
        yield "aten.convolution.default", (s.input, w, b, stride, padding, dilation, False, [0] * nd, groups)


def _ints(v, n):
    """An int or int list as aten's ``int[n]`` (exported graphs always hold lists)."""
    if v is None:
        return []
    return [int(v)] * n if isinstance(v, (int, float)) else [int(i) for i in v]


def _avg(s, nd):
    a = list(s.args)
    names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
    vals = dict(zip(names, a, strict=False))
    vals.update(s.kwargs)
    stride = vals.get("stride") or []
    args = (
        s.input,
        vals["kernel_size"],
        stride,
        vals.get("padding", 0),
        vals.get("ceil_mode", False),
        vals.get("count_include_pad", True),
    )
    if nd > 1:
        args += (vals.get("divisor_override"),)
    yield f"aten.avg_pool{nd}d.default", args


def _max(s, nd):
    names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
    vals = dict(zip(names, s.args, strict=False))
    vals.update({k: v for k, v in s.kwargs.items() if k != "return_indices"})
    yield (
        f"aten.max_pool{nd}d_with_indices.default",
        (
            s.input,
            vals["kernel_size"],
            vals.get("stride") or [],
            vals.get("padding", 0),
            vals.get("dilation", 1),
            vals.get("ceil_mode", False),
        ),
    )


def _adaptive(s, nd):
    size = s.args[0] if s.args else s.kwargs["output_size"]
    size = [size] * nd if isinstance(size, int) else list(size)
    size = [s.input.shape[s.input.ndim - nd + i] if v is None else v for i, v in enumerate(size)]
    key = "aten.adaptive_avg_pool1d.default" if nd == 1 else f"aten._adaptive_avg_pool{nd}d.default"
    yield key, (s.input, size)


def _interp(s, mode):
    kw = dict(s.kwargs)
    size = s.args[0] if s.args else kw.get("size")
    sf = kw.get("scale_factor")
    if kw.get("antialias") or mode == "area":
        return
    nd = s.input.ndim - 2
    if kw.get("recompute_scale_factor") and sf is not None:
        size = [int(math.floor(n * (sf if isinstance(sf, (int, float)) else sf[i]))) for i, n in enumerate(s.input.shape[2:])]
        sf = None
    size = None if size is None else [size] * nd if isinstance(size, int) else list(size)
    sf = None if sf is None else [float(sf)] * nd if isinstance(sf, (int, float)) else [float(v) for v in sf]
    names = {
        "nearest": "upsample_nearest",
        "nearest-exact": "_upsample_nearest_exact",
        "linear": "upsample_linear",
        "bilinear": "upsample_bilinear",
        "bicubic": "upsample_bicubic",
        "trilinear": "upsample_trilinear",
    }
    key = f"aten.{names[mode]}{nd}d.vec"
    if mode.startswith("nearest"):
        yield key, (s.input, size, sf)
    else:
        if not s.input.dtype.is_floating_point:
            return
        yield key, (s.input, size, bool(kw.get("align_corners") or False), sf)


def _pad(s, mode):
    pad = list(s.args[0])
    n = len(pad) // 2
    if mode == "constant":
        yield "aten.constant_pad_nd.default", (s.input, pad, s.kwargs.get("value", s.args[2] if len(s.args) > 2 else 0) or 0)
    elif mode in ("reflect", "replicate"):
        name = "reflection" if mode == "reflect" else "replication"
        if s.input.ndim in (n + 1, n + 2) and not (False):
            yield f"aten.{name}_pad{n}d.default", (s.input, pad)


def _losses(s, name):
    kw = dict(s.kwargs)
    red = RED[kw.get("reduction", "mean")]
    t = s.args[0]
    if name == "cross_entropy":
        yield (
            "aten.cross_entropy_loss.default",
            (s.input, t, kw.get("weight"), red, kw.get("ignore_index", -100), kw.get("label_smoothing", 0.0)),
        )
    elif name == "nll_loss":
        yield "aten.nll_loss_nd.default", (s.input, t, kw.get("weight"), red, kw.get("ignore_index", -100))
    elif name in ("mse_loss", "l1_loss"):
        yield f"aten.{name}.default", (s.input, t, red)
    elif name == "smooth_l1_loss":
        yield "aten.smooth_l1_loss.default", (s.input, t, red, kw.get("beta", 1.0))
    elif name == "huber_loss":
        yield "aten.huber_loss.default", (s.input, t, red, kw.get("delta", 1.0))
    elif name == "binary_cross_entropy":
        yield "aten.binary_cross_entropy.default", (s.input, t, kw.get("weight"), red)
    elif name == "binary_cross_entropy_with_logits":
        yield "aten.binary_cross_entropy_with_logits.default", (s.input, t, kw.get("weight"), kw.get("pos_weight"), red)


def _gridsample(s):
    if s.input.ndim != 4:
        return
    kw = s.kwargs
    modes = {"bilinear": 0, "nearest": 1, "bicubic": 2}
    pads = {"zeros": 0, "border": 1, "reflection": 2}
    yield (
        "aten.grid_sampler_2d.default",
        (
            s.input,
            s.args[0],
            modes[kw.get("mode", "bilinear")],
            pads[kw.get("padding_mode", "zeros")],
            bool(kw.get("align_corners") or False),
        ),
    )


def _direct(key):
    def adapt(s):
        yield key, (s.input, *s.args)

    return adapt


def _kw_after(key, names_defaults):
    def adapt(s):
        vals = dict(zip([n for n, _ in names_defaults], s.args, strict=False))
        vals.update(s.kwargs)
        yield key, (s.input, *(vals.get(n, d) for n, d in names_defaults))

    return adapt


def _batch_norm(s):
    rm, rv = s.args[0], s.args[1]
    w = s.args[2] if len(s.args) > 2 else s.kwargs.get("weight")
    b = s.args[3] if len(s.args) > 3 else s.kwargs.get("bias")
    kw = s.kwargs
    yield (
        "aten.batch_norm.default",
        (s.input, w, b, rm, rv, kw.get("training", False), kw.get("momentum", 0.1), kw.get("eps", 1e-5), False),
    )


def _instance_norm(s):
    kw = s.kwargs
    yield (
        "aten.instance_norm.default",
        (
            s.input,
            kw.get("weight"),
            kw.get("bias"),
            kw.get("running_mean"),
            kw.get("running_var"),
            kw.get("use_input_stats", True),
            kw.get("momentum", 0.1),
            kw.get("eps", 1e-5),
            False,
        ),
    )


def _legit(s):
    if len(s.args) == 7:
        yield "aten._native_batch_norm_legit.default", (s.input, *s.args)
    else:
        yield "aten._native_batch_norm_legit.no_stats", (s.input, *s.args)


def _embedding(s):
    kw = s.kwargs
    if kw.get("max_norm") is not None:
        return
    yield "aten.embedding.default", (s.input, s.args[0], kw.get("padding_idx") if kw.get("padding_idx") is not None else -1)


def _sdpa(s):
    kw = s.kwargs
    if kw.get("dropout_p", 0.0):
        return
    mask = s.args[2] if len(s.args) > 2 else kw.get("attn_mask")
    yield (
        "aten.scaled_dot_product_attention.default",
        (s.input, s.args[0], s.args[1], mask, 0.0, kw.get("is_causal", False)),
        {"scale": kw.get("scale"), "enable_gqa": kw.get("enable_gqa", False)},
    )


def _act(key):
    def adapt(s):
        if s.kwargs.get("inplace"):
            return
        yield key, (s.input, *s.args)

    return adapt


ADAPTERS = {
    ("nn.functional.conv1d", ""): lambda s: _conv(s, 1, False),
    ("nn.functional.conv2d", ""): lambda s: _conv(s, 2, False),
    ("nn.functional.conv3d", ""): lambda s: _conv(s, 3, False),
    ("nn.functional.conv_transpose1d", ""): lambda s: _conv(s, 1, True),
    ("nn.functional.conv_transpose2d", ""): lambda s: _conv(s, 2, True),
    ("nn.functional.conv_transpose3d", ""): lambda s: _conv(s, 3, True),
    ("nn.functional.linear", ""): _direct("aten.linear.default"),
    ("matmul", ""): _direct("aten.matmul.default"),
    ("nn.functional.avg_pool1d", ""): lambda s: _avg(s, 1),
    ("nn.functional.avg_pool2d", ""): lambda s: _avg(s, 2),
    ("nn.functional.avg_pool3d", ""): lambda s: _avg(s, 3),
    ("nn.functional.max_pool1d", ""): lambda s: _max(s, 1),
    ("nn.functional.max_pool2d", ""): lambda s: _max(s, 2),
    ("nn.functional.max_pool3d", ""): lambda s: _max(s, 3),
    ("nn.functional.adaptive_avg_pool1d", ""): lambda s: _adaptive(s, 1),
    ("nn.functional.adaptive_avg_pool2d", ""): lambda s: _adaptive(s, 2),
    ("nn.functional.adaptive_avg_pool3d", ""): lambda s: _adaptive(s, 3),
    ("native_layer_norm", ""): _direct("aten.native_layer_norm.default"),
    ("native_group_norm", ""): _direct("aten.native_group_norm.default"),
    ("native_batch_norm", ""): _direct("aten.native_batch_norm.default"),
    ("_native_batch_norm_legit", ""): _legit,
    ("nn.functional.batch_norm", ""): _batch_norm,
    ("nn.functional.instance_norm", ""): _instance_norm,
    ("nn.functional.layer_norm", ""): _kw_after(
        "aten.layer_norm.default", [("normalized_shape", None), ("weight", None), ("bias", None), ("eps", 1e-5)]
    ),
    ("nn.functional.group_norm", ""): _kw_after(
        "aten.group_norm.default", [("num_groups", None), ("weight", None), ("bias", None), ("eps", 1e-5)]
    ),
    ("nn.functional.rms_norm", ""): _kw_after(
        "aten.rms_norm.default", [("normalized_shape", None), ("weight", None), ("eps", None)]
    ),
    ("nn.functional.pad", "reflect"): lambda s: _pad(s, "reflect"),
    ("nn.functional.pad", "replicate"): lambda s: _pad(s, "replicate"),
    ("nn.functional.pad", "replicate_negative"): lambda s: _pad(s, "replicate"),
    ("nn.functional.embedding", ""): _embedding,
    ("nn.functional.scaled_dot_product_attention", ""): _sdpa,
    ("nn.functional.grid_sample", ""): _gridsample,
    ("grid_sampler_2d", ""): _direct("aten.grid_sampler_2d.default"),
    ("nn.functional.hardswish", ""): _act("aten.hardswish_.default"),
    ("nn.functional.hardsigmoid", ""): _act("aten.hardsigmoid_.default"),
    ("nn.functional.silu", ""): _act("aten.silu_.default"),
    ("nn.functional.mish", ""): _act("aten.mish.default"),
    ("nn.functional.softplus", ""): _kw_after("aten.softplus.default", [("beta", 1), ("threshold", 20)]),
    ("flatten", ""): _kw_after("aten.flatten.using_ints", [("start_dim", 0), ("end_dim", -1)]),
    ("unflatten", ""): _direct("aten.unflatten.int"),
    **{
        ("nn.functional.interpolate", m): (lambda mode: lambda s: _interp(s, mode))(m)
        for m in ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear")
    },
    **{
        ("nn.functional." + n, ""): (lambda name: lambda s: _losses(s, name))(n)
        for n in (
            "cross_entropy",
            "nll_loss",
            "mse_loss",
            "l1_loss",
            "smooth_l1_loss",
            "huber_loss",
            "binary_cross_entropy",
            "binary_cross_entropy_with_logits",
        )
    },
}


def _opinfos():
    from torch.testing._internal.common_methods_invocations import op_db

    found = {(o.name, o.variant_test_name): o for o in op_db}
    return [found[k] for k in ADAPTERS if k in found]


OPINFOS = _opinfos()


def test_every_adapter_has_an_opinfo():
    assert len(OPINFOS) == len(ADAPTERS), sorted(set(ADAPTERS) - {(o.name, o.variant_test_name) for o in OPINFOS})


@pytest.mark.parametrize(
    "opinfo",
    OPINFOS,
    ids=lambda o: (o.name + ("." + o.variant_test_name if o.variant_test_name else "")).replace("nn.functional.", ""),
)
def test_opinfo_samples(opinfo):
    ran = 0
    supported = opinfo.supported_dtypes("cpu")
    for dtype in DTYPES:
        if dtype not in supported:
            continue
        torch.manual_seed(0)
        n = 0
        for s in opinfo.sample_inputs("cpu", dtype, requires_grad=False):
            if n >= SAMPLES:
                break
            for call in ADAPTERS[(opinfo.name, opinfo.variant_test_name)](s):
                key, args, kwargs = call if len(call) == 3 else (*call, {})
                try:
                    torch_op(key)(*clone(args), **clone(kwargs))
                except (RuntimeError, IndexError, ValueError) as e:  # torch refuses the sample: torchless must refuse it too
                    assert "Expected a value of type" not in str(e), f"the adapter of {key} passes a bad argument: {e}"
                    with pytest.raises(TorchlessError):
                        registry.require(key)(*to_np(args), **{k: to_np(v) for k, v in kwargs.items()})
                    continue
                check(key, *args, **kwargs)
                n += 1
                ran += 1
    assert ran, "no sample ran"


# -- generated inputs for the overloads without an OpInfo --------------------------------


def _t(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_and_backward_grid(nd, transposed):
    torch.manual_seed(nd)
    for groups, stride, pad, dil in [(1, 1, 0, 1), (2, 2, 1, 1), (1, 2, 0, 2), (2, 1, 1, 2), (1, 2, 1, 1)]:
        cin, cout = 4, 6
        x = _t(2, cin, *[7, 6, 5][:nd])
        w = _t(*((cin, cout // groups) if transposed else (cout, cin // groups)), *[3, 2, 3][:nd])
        b = _t(cout)
        op = [1 if transposed and stride > 1 else 0] * nd
        args = ([stride] * nd, [pad] * nd, [dil] * nd, transposed, op, groups)
        check("aten.convolution.default", x, w, b, *args)
        out = torch.ops.aten.convolution.default(x, w, b, *args)
        check("aten.convolution_backward.default", torch.randn_like(out), x, w, [cout], *args, [True, True, True])
    # depthwise, bf16, and padding="same" with dilation
    x, w = _t(2, 8, *[9] * nd, dtype=torch.float32), _t(8, 1, *[3] * nd, dtype=torch.float32)
    if not transposed:
        check("aten.convolution.default", x, w, None, [2] * nd, [1] * nd, [1] * nd, False, [0] * nd, 8)
        check("aten.convolution.default", x.bfloat16(), w.bfloat16(), None, [1] * nd, [1] * nd, [1] * nd, False, [0] * nd, 8)
        check(f"aten.conv{nd}d.padding", x, _t(3, 8, *[4] * nd, dtype=torch.float32), None, [1] * nd, "same", [2] * nd, 1)
        check(
            "aten.convolution_backward.default",
            _t(2, 8, *[9] * nd, dtype=torch.float32),
            x,
            w,
            None,
            [1] * nd,
            [1] * nd,
            [1] * nd,
            False,
            [0] * nd,
            8,
            [True, True, False],
        )


def test_col2im():
    torch.manual_seed(1)
    for (h, w), k, d, p, s in [((5, 6), (2, 2), (1, 1), (1, 0), (2, 2)), ((7, 7), (3, 2), (2, 1), (1, 1), (1, 2))]:
        blocks = [(o + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for o, pp, dd, kk, ss in zip((h, w), p, d, k, s, strict=True)]
        x = _t(2, 3 * k[0] * k[1], blocks[0] * blocks[1])
        check("aten.col2im.default", x, [h, w], list(k), list(d), list(p), list(s))
        check("aten.col2im.default", x[0], [h, w], list(k), list(d), list(p), list(s))


def test_pool_backwards():
    torch.manual_seed(2)
    for k, s, p, ceil, cip, div in [
        (2, 1, 0, False, True, None),
        (3, 2, 1, True, False, None),
        (3, 2, 1, False, True, 3),
        (2, 2, 1, True, True, None),
    ]:
        x = _t(2, 3, 9, 8)
        args = ([k, k], [s, s], [p, p], ceil, cip, div)
        go = torch.randn_like(torch.ops.aten.avg_pool2d.default(x, *args))
        check("aten.avg_pool2d_backward.default", go, x, *args)
        x3 = _t(1, 2, 5, 6, 4)
        go3 = torch.randn_like(torch.ops.aten.avg_pool3d.default(x3, [k] * 3, [s] * 3, [p] * 3, ceil, cip, div))
        check("aten.avg_pool3d_backward.default", go3, x3, [k] * 3, [s] * 3, [p] * 3, ceil, cip, div)
        for dil in (1, 2):
            try:
                out, idx = torch.ops.aten.max_pool2d_with_indices.default(x, [k, k], [s, s], [p, p], [dil, dil], ceil)
            except RuntimeError:
                continue
            check(
                "aten.max_pool2d_with_indices_backward.default",
                torch.randn_like(out),
                x,
                [k, k],
                [s, s],
                [p, p],
                [dil, dil],
                ceil,
                idx,
            )
    x = _t(2, 3, 9, 8)
    check("aten._adaptive_avg_pool2d_backward.default", _t(2, 3, 4, 3), x)
    check("aten._adaptive_avg_pool3d_backward.default", _t(2, 3, 2, 4, 3), _t(2, 3, 5, 9, 8))
    check("aten.adaptive_avg_pool2d.default", x, [4, 5])
    check("aten.max_pool2d.default", x, [3, 3], [2, 2], [1, 1], [1, 1], True)


def test_max_pool_nan_and_int():
    x = torch.randn(1, 2, 7, 7)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = float("nan")
    check("aten.max_pool2d_with_indices.default", x, [3, 3], [2, 2])
    xi = torch.randint(-50, 50, (2, 3, 7, 7))
    check("aten.max_pool2d_with_indices.default", xi, [3, 3], [2, 2], [1, 1])
    check("aten.avg_pool2d.default", xi, [3, 3], [2, 2], [1, 1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_batch_norm_family(dtype):
    torch.manual_seed(3)
    stat = torch.float32 if dtype == torch.bfloat16 else dtype  # bf16 input, float32 parameters (AMP)
    x, w, b = _t(4, 6, 5, 3, dtype=dtype), _t(6, dtype=stat), _t(6, dtype=stat)
    rm, rv = _t(6, dtype=stat), torch.rand(6, dtype=stat) + 0.5
    for training in (True, False):
        check("aten._native_batch_norm_legit.default", x, w, b, rm, rv, training, 0.1, 1e-5)
        check("aten._native_batch_norm_legit_functional.default", x, w, b, rm, rv, training, 0.1, 1e-5)
        check("aten.batch_norm.default", x, w, b, rm, rv, training, 0.3, 1e-5, False)
    check("aten._native_batch_norm_legit.no_stats", x, None, None, True, 0.1, 1e-3)
    check("aten._native_batch_norm_legit_no_training.default", x, w, b, rm, rv, 0.1, 1e-5)
    check("aten._native_batch_norm_legit_no_training.default", x[:, :, 0, 0], None, None, rm, rv, 0.1, 1e-5)


def test_layer_and_group_norm_backward():
    torch.manual_seed(4)
    x = _t(4, 6, 5, 3)
    lw, lb = _t(5, 3), _t(5, 3)
    _, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [5, 3], lw, lb, 1e-5)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        check("aten.native_layer_norm_backward.default", torch.randn_like(x), x, [5, 3], mean, rstd, lw, lb, mask)
    check("aten.native_layer_norm_backward.default", torch.randn_like(x), x, [5, 3], mean, rstd, None, None, [True, False, False])
    w = _t(6)
    _, gm, gr = torch.ops.aten.native_group_norm.default(x, w, _t(6), 4, 6, 15, 3, 1e-5)
    for mask in ([True, True, True], [True, False, False]):
        check("aten.native_group_norm_backward.default", torch.randn_like(x), x, gm, gr, w, 4, 6, 15, 3, mask)
    check("aten.native_group_norm_backward.default", torch.randn_like(x), x, gm, gr, None, 4, 6, 15, 3, [True, False, False])


def test_embedding_family():
    torch.manual_seed(5)
    w = _t(10, 4, dtype=torch.float32)
    idx = torch.randint(0, 10, (3, 5))
    check("aten.embedding.default", w, idx, 2)
    for pad_idx, scale in itertools.product([-1, 3], [False, True]):
        check("aten.embedding_dense_backward.default", _t(3, 5, 4, dtype=torch.float32), idx, 10, pad_idx, scale)
    flat = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    for mode, last, pad_idx in itertools.product([0, 1, 2], [False, True], [-1, 4]):
        offsets = torch.tensor([0, 4, 6, 8]) if last else torch.tensor([0, 4, 6])
        ref = torch.ops.aten._embedding_bag.default(w, flat, offsets, False, mode, False, None, last, pad_idx)
        got = registry.require("aten._embedding_bag.default")(*to_np((w, flat, offsets, False, mode, False, None, last, pad_idx)))
        np.testing.assert_allclose(got[0], ref[0].numpy(), rtol=1e-6, atol=1e-6)
        if mode == 2:  # the source rows of the maxima
            np.testing.assert_array_equal(got[3], ref[3].numpy())
        if mode != 0:
            np.testing.assert_array_equal(got[2], ref[2].numpy())
    psw = torch.rand(8)
    ref = torch.ops.aten._embedding_bag.default(w, flat, torch.tensor([0, 4, 6]), False, 0, False, psw)
    got = registry.require("aten._embedding_bag.default")(*to_np((w, flat, torch.tensor([0, 4, 6]), False, 0, False, psw)))
    np.testing.assert_allclose(got[0], ref[0].numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(TorchlessError):
        registry.require("aten.embedding.default")(to_np(w), np.array([10]))


def test_padding_and_upsampling_overloads():
    torch.manual_seed(6)
    x, x5 = _t(2, 3, 6, 7), _t(2, 3, 4, 6, 7)
    check("aten.reflection_pad1d.default", x[0], [2, 3])
    check("aten.reflection_pad2d.default", x, [1, 2, 3, 0])
    check("aten.reflection_pad3d.default", x5, [1, 2, 1, 0, 1, 1])
    check("aten.replication_pad2d.default", x, [1, 2, 3, 0])
    check("aten.replication_pad3d.default", x5, [1, 2, 3, 0, 1, 1])
    check("aten.pad.default", x, [1, -2, 3, 0], "constant", 1.5)
    for mode in ("constant", "reflect", "replicate", "circular"):
        check("aten.pad.default", x, [1, 2, 2, 1], mode)
    for ac in (False, True):
        check("aten.upsample_bilinear2d.default", x, [13, 5], ac)
        check("aten.upsample_bilinear2d.default", x, [15, 14], ac, 2.5, 2.0)
        check("aten.upsample_bicubic2d.default", x, [13, 5], ac)
        check("aten.upsample_linear1d.default", x[0], [11], ac)
        check("aten.upsample_trilinear3d.default", x5, [5, 9, 3], ac)
    for size, scales in (([12, 14], (None, None)), ([13, 5], (None, None)), ([15, 10], (2.5, 1.5))):
        check("aten.upsample_nearest2d.default", x, size, *scales)
        check("aten.upsample_nearest2d.vec", x, None, [2.5, 1.5])
    check("aten.upsample_nearest1d.default", x[0], [11])
    check("aten.upsample_nearest3d.default", x5, [5, 9, 3])
    check("aten.upsample_bilinear2d.vec", x.bfloat16(), None, False, [2.0, 2.0])


def test_dropout_is_random_with_torch_statistics():
    x = torch.ones(200, 200)
    out, mask = registry.require("aten.native_dropout.default")(to_np(x), 0.3, True)
    assert mask.dtype == np.bool_ and abs(mask.mean() - 0.7) < 0.02
    np.testing.assert_allclose(out[mask], 1 / 0.7, rtol=1e-6)
    assert (out[~mask] == 0).all()
    check("aten.native_dropout.default", x[:4, :4], 0.3, False)
    check("aten.dropout.default", x[:4, :4], 0.3, False)
    y = registry.require("aten.dropout.default")(to_np(x), 0.5, True)
    assert abs((y == 0).mean() - 0.5) < 0.02
    out, mask = registry.require("aten.native_dropout.default")(to_np(x[:3]), 1.0, True)
    assert not mask.any() and not out.any()
    from torchless.interp.kernels import create

    masks = []
    for _ in range(2):  # create.seed makes a run repeatable
        create.seed(3)
        masks.append(registry.require("aten.native_dropout.default")(to_np(x[:8]), 0.5, True)[1])
    np.testing.assert_array_equal(masks[0], masks[1])


def test_attention_and_activations():
    torch.manual_seed(7)
    q, k, v = _t(2, 3, 5, 8, dtype=torch.float32), _t(2, 3, 7, 8, dtype=torch.float32), _t(2, 3, 7, 4, dtype=torch.float32)
    check("aten.scaled_dot_product_attention.default", q, k, v)
    check("aten.scaled_dot_product_attention.default", q, k, v, is_causal=True, scale=0.3)
    m = torch.rand(5, 7) > 0.5
    m[0] = False  # a fully masked row: zeros, as torch's safe softmax
    check("aten.scaled_dot_product_attention.default", q, k, v, m)
    check("aten.scaled_dot_product_attention.default", q, k, v, _t(5, 7, dtype=torch.float32))
    check("aten.scaled_dot_product_attention.default", q, k[:, :1], v[:, :1], enable_gqa=True)
    check("aten.scaled_dot_product_attention.default", q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    y = _t(50, dtype=torch.float32) * 5
    check("aten.mish.default", y)
    check("aten.mish.default", y.bfloat16())
    for name in ("hardswish", "hardsigmoid", "silu", "mish"):
        check(f"aten.{name}_.default", y.clone())
        check(f"aten.{name}_.default", y.bfloat16())


def test_rnns():
    torch.manual_seed(8)
    for cls, key, bi, bf, nl, bias, proj, unbatched in itertools.product(
        [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN],
        [None],
        [False, True],
        [False, True],
        [1, 2],
        [True, False],
        [0, 3],
        [False, True],
    ):
        if proj and cls is not torch.nn.LSTM:
            continue
        if unbatched:  # the modules unsqueeze an unbatched input; the aten op takes 3-D only
            continue
        m = cls(
            5, 6, num_layers=nl, bias=bias, batch_first=bf, bidirectional=bi, **({"proj_size": proj} if proj else {})
        ).double()
        x = _t(4, 5) if unbatched else _t(3, 4, 5)
        d = 2 if bi else 1
        shape = (nl * d,) if unbatched else (nl * d, 3 if bf else 4)
        params = [p.detach() for p in m._flat_weights]
        h0 = _t(*shape, proj or 6)
        if cls is torch.nn.LSTM:
            check("aten.lstm.input", x, [h0, _t(*shape, 6)], params, bias, nl, 0.0, False, bi, bf)
        else:
            key = "aten.gru.input" if cls is torch.nn.GRU else "aten.rnn_tanh.input"
            check(key, x, h0, params, bias, nl, 0.0, False, bi, bf)
            if cls is torch.nn.RNN:
                check("aten.rnn_relu.input", x, h0, params, bias, nl, 0.0, False, bi, bf)


def test_softmax_int():
    torch.manual_seed(10)
    x = _t(3, 4, 5, dtype=torch.float32)
    x[0, 0] = float("-inf")
    for key in ("aten.softmax.int", "aten.log_softmax.int"):
        for dim in (0, -1, 1):
            check(key, x, dim)
        check(key, x, 1, torch.float64)
        check(key, x.bfloat16(), 2)
        check(key, x.bfloat16(), 2, torch.float32)
        check(key, torch.tensor(1.5), 0)


def test_softmax_rows_with_nan_and_inf():
    # the kernels subtract a NaN-skipping row max (np.fmax): a NaN must still spread to its
    # whole row, as it does through torch's NaN max
    nan, inf = float("nan"), float("inf")
    rows = [
        [0.5, nan, -1.0, 2.0],
        [nan, nan, nan, nan],
        [inf, 1.0, nan, 0.0],
        [inf, 1.0, -inf, 0.0],
        [-inf, -inf, -inf, -inf],
        [-inf, 3.0, -inf, -2.0],
        [1e30, -1e30, 0.0, 1.0],
    ]
    x = torch.tensor(rows, dtype=torch.float32)
    for key in ("aten.softmax.int", "aten.log_softmax.int"):
        check(key, x, -1)
        check(key, x.T.contiguous(), 0)
    for key in ("aten._softmax.default", "aten._log_softmax.default"):
        check(key, x, -1, False)
        check(key, x.T.contiguous(), 0, False)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    q = torch.tensor(rows[:4], dtype=torch.float32).reshape(1, 1, 4, 4)
    check("aten.scaled_dot_product_attention.default", q, q, q, mask)


def test_losses_grid():
    torch.manual_seed(9)
    logits, t, w = _t(6, 5, dtype=torch.float32), torch.randint(0, 5, (6,)), torch.rand(5)
    t[0] = -100
    probs = torch.softmax(_t(6, 5, dtype=torch.float32), 1)
    for red, ls, ww in itertools.product([0, 1, 2], [0.0, 0.2], [None, w]):
        check("aten.cross_entropy_loss.default", logits, t, ww, red, -100, ls)
        check("aten.cross_entropy_loss.default", logits, probs, ww, red, -100, ls)
        lp = torch.log_softmax(logits, 1)
        check("aten.nll_loss.default", lp, t, ww, red, -100)
        if red:
            check("aten.nll_loss_forward.default", lp, t, ww, red, -100)
    l4, t4 = _t(2, 5, 3, 4, dtype=torch.float32), torch.randint(0, 5, (2, 3, 4))
    check("aten.cross_entropy_loss.default", l4, t4)
    check("aten.nll_loss2d_forward.default", torch.log_softmax(l4, 1), t4, None, 1, -100)


# -- coverage -----------------------------------------------------------------------------

NN_CORE = [
    "_adaptive_avg_pool2d.default",
    "_adaptive_avg_pool2d_backward.default",
    "_adaptive_avg_pool3d.default",
    "_embedding_bag.default",
    "_native_batch_norm_legit.default",
    "_native_batch_norm_legit.no_stats",
    "_native_batch_norm_legit_no_training.default",
    "adaptive_avg_pool1d.default",
    "avg_pool1d.default",
    "avg_pool2d.default",
    "avg_pool2d_backward.default",
    "avg_pool3d.default",
    "col2im.default",
    "convolution.default",
    "convolution_backward.default",
    "embedding.default",
    "embedding_dense_backward.default",
    "grid_sampler_2d.default",
    "max_pool2d_with_indices.default",
    "max_pool2d_with_indices_backward.default",
    "max_pool3d_with_indices.default",
    "native_dropout.default",
    "native_group_norm.default",
    "native_group_norm_backward.default",
    "native_layer_norm.default",
    "native_layer_norm_backward.default",
    "reflection_pad1d.default",
    "reflection_pad2d.default",
    "reflection_pad3d.default",
    "replication_pad2d.default",
    "replication_pad3d.default",
    "upsample_bilinear2d.vec",
    "upsample_nearest2d.vec",
]

#: what torch.export leaves in training IR for the model zoo (gelu, hardswish, silu, constant_pad_nd: the
#: elementwise and shape families')
TRAINING_IR = [
    "linear.default",
    "conv1d.default",
    "conv2d.default",
    "conv3d.default",
    "conv2d.padding",
    "conv_transpose1d.default",
    "conv_transpose2d.input",
    "batch_norm.default",
    "layer_norm.default",
    "group_norm.default",
    "dropout.default",
    "scaled_dot_product_attention.default",
    "hardswish_.default",
    "silu_.default",
    "rms_norm.default",
    "lstm.input",
    "gru.input",
    "cross_entropy_loss.default",
    "nll_loss.default",
    "max_pool2d.default",
    "adaptive_avg_pool2d.default",
    "flatten.using_ints",
    "softmax.int",
    "matmul.default",
    "_native_batch_norm_legit_functional.default",
    "upsample_bilinear2d.vec",
]


def test_nn_family_covers_its_core_and_training_ir_ops():
    have = registry.supported()
    core = set()
    import importlib.resources

    from torchless.graph import schema  # noqa: F401  (the spec list lives with the graph layer)

    text = importlib.resources.files("torchless.graph").joinpath("data/core_aten_ops.txt").read_text()
    core = {line.split("\t")[0].removeprefix("aten::") for line in text.splitlines() if line and not line.startswith("#")}
    missing_core = [k for k in NN_CORE if k not in core]
    assert not missing_core, f"not core ops (fix the list): {missing_core}"
    missing = [k for k in NN_CORE + TRAINING_IR if "aten." + k not in have]
    assert not missing, f"no kernel for {missing}"


def test_float16_upcasts_like_torch():
    """float16 is computed in float32 and rounded once, as torch's CPU kernels do."""
    torch.manual_seed(11)
    h = torch.float16
    x = _t(2, 4, 9, 9, dtype=h)
    check("aten.convolution.default", x, _t(6, 2, 3, 3, dtype=h), _t(6, dtype=h), [1, 1], [1, 1], [1, 1], False, [0, 0], 2)
    check("aten.native_layer_norm.default", x, [9, 9], _t(9, 9, dtype=h), None, 1e-5)
    check("aten.native_group_norm.default", x, None, None, 2, 4, 81, 2, 1e-5)
    check("aten.avg_pool2d.default", x, [3, 3], [2, 2], [1, 1], True, False)
    check("aten.max_pool2d_with_indices.default", x, [3, 3], [2, 2], [1, 1])
    check("aten._adaptive_avg_pool2d.default", x, [4, 5])
    check("aten.upsample_bilinear2d.vec", x, [13, 17], False, None)
    check("aten.upsample_nearest2d.vec", x, None, [2.0, 1.5])
    q = _t(2, 3, 5, 8, dtype=h)
    check("aten.scaled_dot_product_attention.default", q, _t(2, 3, 7, 8, dtype=h), _t(2, 3, 7, 4, dtype=h), is_causal=True)
    check("aten.linear.default", _t(5, 8, dtype=h), _t(3, 8, dtype=h), _t(3, dtype=h))
    check("aten.rms_norm.default", x, [9], _t(9, dtype=h))
