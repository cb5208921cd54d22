"""Confidential-computing overhead on GPUs: detect, measure, emulate, compare.

Light on import: the modules import torch, transformers and cryptography only when used.
"""
