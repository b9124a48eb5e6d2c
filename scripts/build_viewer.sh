#!/usr/bin/env bash
# Rebuild the viewer's front end (viewer/) into src/torchless/view/static/ from the lockfile.
# Needs Node and npm (the Python package does not: the build output is committed).
set -euo pipefail
cd "$(dirname "$0")/../viewer"
npm ci --no-audit --no-fund --ignore-scripts >/dev/null
node build.mjs
