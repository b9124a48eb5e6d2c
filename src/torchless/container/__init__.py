"""Containers, each read with its loader's own rules: zip (miniz and zipfile), FlatBuffers."""
