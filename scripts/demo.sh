#!/usr/bin/env bash
# The main job: set up torchless (no torch needed) and run it on the sample artifacts in
# samples/ - every format, every generic command, the scanner.
set -euo pipefail
cd "$(dirname "$0")/.."
# TORCHLESS_DEMO_CLI: an installed torchless command to run instead (tests/test_demo.py
# runs the demo that way, without setting anything up)
if [ -z "${TORCHLESS_DEMO_CLI:-}" ]; then
  bash scripts/setup.sh cli,onnx
fi
tl=${TORCHLESS_DEMO_CLI:-.venv/bin/torchless}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() { echo; echo "\$ torchless $*"; "$tl" "$@"; }
try() { echo; echo "\$ torchless $*"; "$tl" "$@" || echo "(exit $?)"; }

# eager checkpoints
run info samples/checkpoint.pt
run ls samples/state_dict.pt
run info samples/legacy_format.pt
run verify samples/checkpoint.pt
run convert samples/state_dict.pt "$out/state_dict.safetensors"
run convert "$out/state_dict.safetensors" "$out/state_dict.npz"
# (exit 1: the tied lm_head.weight is stored once in safetensors, as transformers stores it,
# so diff reports it removed)
try diff samples/state_dict.pt "$out/state_dict.npz"
# TorchScript
run info samples/scripted_module.pt
run code samples/scripted_module.pt --method forward
run ls samples/scripted_module.ptl
run ts bytecode samples/scripted_module.ptl --method forward
# ExportedProgram
run info samples/mlp.pt2
run graph samples/mlp.pt2
run verify samples/mlp.pt2
# ONNX
run info samples/mlp.onnx
run convert samples/mlp.onnx "$out/mlp.safetensors"
run onnx set-weights samples/mlp.onnx "$out/mlp.safetensors" -o "$out/mlp2.onnx"
run diff samples/mlp.onnx "$out/mlp2.onnx"
# distributed checkpoint
run info samples/dcp_ckpt
run convert samples/dcp_ckpt "$out/consolidated.pt"
run reshard samples/dcp_ckpt "$out/ckpt3" --ranks 3
run ls "$out/ckpt3"
# AOTInductor package (the shared objects are never loaded)
run info samples/mlp_aoti.pt2
run verify samples/mlp_aoti.pt2
run extract samples/mlp_aoti.pt2 "$out/aoti"
run convert samples/mlp_aoti.pt2 "$out/aoti.safetensors"
# security scan (exit 1: the samples include two hostile files)
try scan samples/scan
echo
echo "demo finished"
