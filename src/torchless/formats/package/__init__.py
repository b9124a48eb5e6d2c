"""torch.package archives (``torch.package.PackageExporter``), read without running them."""
