"""Lower it: a fused op node becomes its kernel plan's graph while Inductor compiles."""

from .emit import emit
from .splice import expand, input_values, is_fused_op

__all__ = ["emit", "expand", "input_values", "is_fused_op"]
