"""Bridges to other libraries (imported lazily, never at ``import torchless``)."""
