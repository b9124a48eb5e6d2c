"""Tiny random-weight transformers models (GPT-2, Llama, BERT, T5; config objects only)
exported by ``torch.export.export`` in the training IR and, where torch can decompose it,
the ATen IR, saved as ``.pt2`` and run by torchless at two sequence lengths of the dynamic
dim, compared with torch's own module (rtol 1e-4, atol 1e-5). CI runs a representative
pair; ``scripts/hf_zoo.py`` runs all of them (its table: docs/interpreter.md)."""

from __future__ import annotations

import numpy as np
import pytest

import torchless

torch = pytest.importorskip("torch", reason="torch exports the models and is the oracle")
pytest.importorskip("transformers", reason="transformers builds the models")

from . import hf_models  # noqa: E402


@pytest.mark.slow
@pytest.mark.differential
@pytest.mark.parametrize(("name", "ir"), [("llama", "training"), ("bert", "aten")])
def test_transformers_model_matches_torch(tmp_path, name, ir):
    m = hf_models.build(name)
    ep = hf_models.export(name, m)
    if ir == "aten":
        ep = ep.run_decompositions()
    path = tmp_path / f"{name}_{ir}.pt2"
    torch.export.save(ep, path)
    ours = torchless.load(path).module()
    for seq in (8, 13):
        kw = hf_models.inputs(name, 2, seq, seq)
        got = hf_models.first_output(ours(**hf_models.numpy_kwargs(kw)))
        with torch.no_grad():
            want = hf_models.first_output(m(**kw)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} ({ir} IR) at seq {seq}")
