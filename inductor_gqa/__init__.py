"""inductor_gqa: find whole GQA attention blocks in torch.compile graphs and run them fused."""

from . import op  # registers inductor_gqa::attention_block

__version__ = "0.1.0"
