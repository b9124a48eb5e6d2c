"""Values only: errors, dtypes, tensors, torch value types, findings, bounded JSON; no I/O."""
