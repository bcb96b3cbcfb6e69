"""Lowering of ``inductor_gqa::attention_block`` to fused kernels (registered on import)."""

from ..op import register_kernels
from .block import run_block

register_kernels(run_block)

__all__ = ["run_block"]
