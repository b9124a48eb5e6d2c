#!/usr/bin/env bash
# Set up torchless (no torch needed) and run it on the sample artifacts in samples/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh cli,onnx
tl=.venv/bin/torchless
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for f in samples/*; do
  [ -e "$f" ] || continue
  case "$f" in *.py|*.md) continue ;; esac
  echo "== torchless info $f"
  $tl info "$f" || echo "(exit $?)"
done
echo "== torchless ls samples/checkpoint.pt"
$tl ls samples/checkpoint.pt
echo "== torchless verify samples/checkpoint.pt"
$tl verify samples/checkpoint.pt
echo "== torchless convert samples/checkpoint.pt -> safetensors -> npz, then diff"
$tl convert samples/state_dict.pt "$out/state_dict.safetensors"
$tl convert "$out/state_dict.safetensors" "$out/state_dict.npz"
$tl diff samples/state_dict.pt "$out/state_dict.npz"
if [ -f scripts/demo_more.sh ]; then bash scripts/demo_more.sh "$tl" "$out"; fi
echo "demo finished"
