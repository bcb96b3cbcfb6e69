"""inductor_gqa: find whole GQA attention blocks in torch.compile graphs and run them fused.

    torch.compile(model, backend="inductor_gqa")          # works right after pip install
    inductor_gqa.install(); torch.compile(model)          # or inside stock Inductor
"""

from . import op  # registers inductor_gqa::attention_block
from .install import inductor_gqa_backend, install, installed, is_installed, uninstall
from .options import Options

try:  # kernels register themselves as the op's GPU path
    from . import lower  # noqa: F401
except ImportError:  # pragma: no cover - triton missing: the reference still runs
    pass


def _register_backend() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "inductor_gqa" not in _BACKENDS:
        register_backend(name="inductor_gqa")(inductor_gqa_backend)


_register_backend()

__version__ = "0.1.0"
__all__ = ["Options", "install", "installed", "is_installed", "uninstall", "inductor_gqa_backend"]
