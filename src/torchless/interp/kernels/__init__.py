"""The interpreter's kernels, one module per family; each registers its kernels on import
(the modules are listed in :data:`torchless.interp.registry.KERNEL_MODULES`)."""
