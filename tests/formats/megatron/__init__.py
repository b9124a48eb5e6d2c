"""Megatron-LM legacy checkpoints: tensor- and pipeline-parallel ranks merged into one model.

Megatron-LM (megatron-core) needs CUDA and is not installed here: ``layout.py`` writes
the rank folders the way ``megatron/training/checkpointing.py`` lays them out, slicing a
full model with torch as Megatron's parallel layers hold it; the oracle is that full model.
"""
