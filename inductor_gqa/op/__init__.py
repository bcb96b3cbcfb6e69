from .attention_block import OP_NAME, TENSOR_ARGS, attention_block, call_attention_block

__all__ = ["OP_NAME", "TENSOR_ARGS", "attention_block", "call_attention_block"]
