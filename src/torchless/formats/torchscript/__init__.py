"""TorchScript archives (``torch.jit.save`` ``.pt`` and lite-interpreter ``.ptl``) without torch.

Modules: :mod:`.spec` (record names, versions, the C++ pickler's storage names),
:mod:`.read` (archive reader, allowlist, :class:`~.read.ScriptObject`), :mod:`.code`
(the ``code/`` parser and ``.code`` rendering), :mod:`.bytecode` (``bytecode.pkl``),
:mod:`.write` (re-save with new tensors and extra files), :mod:`.handler` (the
``torchscript`` format handler). User guide: ``docs/torchscript.md``.
"""
