"""inductor_gqa: find whole GQA attention blocks in torch.compile graphs and run them fused.

    torch.compile(model, backend="inductor_gqa")          # works right after pip install
    inductor_gqa.install(); torch.compile(model)          # or inside stock Inductor
"""

def _load_patterns() -> None:
    """``patterns/`` ships as ``inductor_gqa.patterns`` in a wheel (pyproject's package-dir); in a
    source checkout used through PYTHONPATH it sits beside the package, so load it from there."""
    import importlib.util
    import pathlib
    import sys

    try:
        from . import patterns  # noqa: F401
        return
    except ImportError:
        pass
    root = pathlib.Path(__file__).resolve().parents[1] / "patterns"
    spec = importlib.util.spec_from_file_location(
        f"{__name__}.patterns", root / "__init__.py", submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    globals()["patterns"] = module


_load_patterns()

from . import op  # noqa: E402  registers inductor_gqa::attention_block
from .install import (inductor_gqa_backend, install, installed, is_installed,  # noqa: E402
                      uninstall)
from .options import Options  # noqa: E402
from .fused import fused_blocks  # noqa: E402

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
__all__ = ["Options", "fused_blocks", "install", "installed", "is_installed", "uninstall",
           "inductor_gqa_backend"]
