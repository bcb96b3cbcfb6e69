from .attention_block import OP_NAME, attention_block, call_attention_block, register_kernels

__all__ = ["OP_NAME", "attention_block", "call_attention_block", "register_kernels"]
