"""Storage: byte sources, URLs through fsspec, atomic outputs, path confinement, CRCs, helper threads."""
