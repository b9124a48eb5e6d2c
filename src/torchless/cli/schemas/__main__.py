"""``python -m torchless.cli.schemas [NAME...]``: print the JSON Schemas of ``--json`` outputs."""

from __future__ import annotations

import json
import sys

from . import SCHEMAS

names = sys.argv[1:] or sorted(SCHEMAS)
unknown = [n for n in names if n not in SCHEMAS]
if unknown:
    print(f"unknown schema {unknown[0]!r}; one of: {', '.join(sorted(SCHEMAS))}", file=sys.stderr)
    sys.exit(2)
print(json.dumps({n: SCHEMAS[n] for n in names}, indent=2))
