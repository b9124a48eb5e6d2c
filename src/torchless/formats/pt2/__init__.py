"""ExportedProgram archives (``torch.export.save`` / ``.pt2``): read, verify, write."""

from .read import InputSpec, OpaqueObject, OutputSpec, Program, Pt2Archive, Signature, read_pt2
from .write import save_pt2

__all__ = ["InputSpec", "OpaqueObject", "OutputSpec", "Program", "Pt2Archive", "Signature", "read_pt2", "save_pt2"]
