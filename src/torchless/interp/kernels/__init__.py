"""Kernels, one module per family, each listed in :data:`torchless.interp.registry.KERNEL_MODULES`."""
