"""The transformers model zoo (tests/interp/zoo_hf.py): each architecture exported in the
training IR and the ATen IR with one dynamic dimension, run by torchless at two sizes of it
and compared with eager torch (every output; rtol 1e-4, atol 1e-5, ints and bools exact).

CI runs the representative subset :data:`CI`; ``TORCHLESS_ZOO=all`` runs every
architecture (as ``scripts/interp_zoo.py`` does, which records the table in
docs/interpreter.md)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="torch exports the models and is the oracle")
pytest.importorskip("transformers", reason="transformers builds the models")

from . import zoo_hf  # noqa: E402

#: one MoE decoder (the custom-op plugin), one vision and one audio encoder, one seq2seq
CI = {("mixtral", "training"), ("vit", "aten"), ("wav2vec2", "aten"), ("bart", "training")}
ALL = os.environ.get("TORCHLESS_ZOO") == "all"

#: programs torch itself cannot produce (its run_decompositions fails), by (arch, IR)
TORCH_CANNOT = {
    ("gpt2", "aten"): "torch's run_decompositions() fails: a view of GPT-2's transposed attention output",
}


def _cases():
    for a in zoo_hf.ARCHS:
        for ir in ("training", "aten"):
            marks = [pytest.mark.slow, pytest.mark.differential]
            if (a.name, ir) not in CI and not ALL:
                marks.append(pytest.mark.skip(reason="not in the CI subset: TORCHLESS_ZOO=all or scripts/interp_zoo.py runs it"))
            elif (a.name, ir) in TORCH_CANNOT:
                marks.append(pytest.mark.skip(reason=TORCH_CANNOT[(a.name, ir)]))
            yield pytest.param(a.name, ir, marks=marks, id=f"{a.name}-{ir}")


@pytest.mark.parametrize(("name", "ir"), list(_cases()))
def test_zoo_model_matches_torch(tmp_path, name, ir):
    arch = zoo_hf.BY_NAME[name]
    rows = zoo_hf.run(arch, ir, str(tmp_path / f"{name}_{ir}.pt2"))
    assert len(rows) == 2
    for size, ok, err, why in rows:
        assert ok, f"{name} ({ir} IR) at size {size}: {why} (max abs diff {err:.2e})"


def test_ci_subset_is_in_the_zoo():
    assert {n for n, _ in CI} <= set(zoo_hf.BY_NAME)
    assert {a.family for a in zoo_hf.ARCHS if any(a.name == n for n, _ in CI)} >= {"moe", "vision", "audio", "seq2seq"}


def test_torchvision_models(tmp_path):
    """torchvision's classification models (resnet18, mobilenet_v3_small, efficientnet_b0)
    in both IRs, when torchvision imports beside this torch."""
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 - the import failing (not only missing) is the skip reason
        pytest.skip(
            "torchvision does not import beside torch "
            f"{torch.__version__} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); the only "
            "torchvision 0.28 wheel is the CUDA build, whose _C.so needs libc10_cuda.so and libtorch_cuda.so"
        )
    import numpy as np

    import torchless

    for ctor in ("resnet18", "mobilenet_v3_small", "efficientnet_b0"):
        torch.manual_seed(0)
        m = getattr(torchvision.models, ctor)(num_classes=10).eval()
        x = torch.randn(2, 3, 64, 64)
        ep = torch.export.export(m, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
        for ir, prog in (("training", ep), ("aten", ep.run_decompositions())):
            path = tmp_path / f"{ctor}_{ir}.pt2"
            torch.export.save(prog, path)
            mod = torchless.load(path).module()
            for b in (2, 3):
                xb = torch.randn(b, 3, 64, 64)
                with torch.no_grad():
                    want = m(xb).numpy()
                np.testing.assert_allclose(mod(xb.numpy()), want, rtol=1e-4, atol=1e-5, err_msg=f"{ctor} {ir}")
