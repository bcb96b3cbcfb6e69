"""Triton kernels of the fused GQA attention block (projection epilogue, flash attention)."""
