#!/usr/bin/env bash
# Create .venv (if missing) and install torchless with the given extras (default: test).
# torch is pinned to 2.13.0 (the CPU build) by the test extra.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
case ",${extras}," in
  *,test,* | *,torch,*)
    # torch first, as a top-level requirement: pip then takes the CPU build this machine
    # keeps on disk (2.13.0+cpu). Left to the extra's metadata alone, a recent pip resolving
    # the whole test extra chose the multi-GB CUDA build of the same version.
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    ;;
esac
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${extras}]"
case ",${extras}," in
  *,test,*)
    # the viewer's browser tests drive Debian's chromium (tests/view/): install it when
    # missing, as root with apt-get (CI runs as root on a fresh Debian machine); never
    # `playwright install`, which downloads a browser build of its own
    if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ||
        echo "setup.sh: could not install chromium; the browser tests will skip" >&2
    fi
    # the az:// tests (tests/remote/test_remote_azure*.py) run against Azurite, Microsoft's
    # Azure Storage emulator (a Node.js program): installed with npm into the ignored
    # .tools/ folder when missing or older. 3.37.0 is the first release with Put Block From
    # URL (the server-side joins of range-task outputs); it declares Node >= 22 but runs
    # the blob service on Node 20 (npm warns; the tests pass).
    AZURITE=3.37.0
    if ! grep -qs "\"version\": \"$AZURITE\"" .tools/node_modules/azurite/package.json; then
      if ! { command -v npm >/dev/null && mkdir -p .tools &&
        npm install --prefix .tools --no-save --no-audit --no-fund --silent "azurite@$AZURITE" >/dev/null 2>&1; }; then
        echo "setup.sh: could not install azurite $AZURITE with npm; the az:// tests will skip" >&2
      fi
    fi
    ;;
esac
