import os

# Triton kernels run on CPU tensors through the interpreter; this must be set before any kernel
# module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_compile_state():
    """Each test compiles from scratch: no Dynamo cache, no FX/AOT graph cache, zeroed counters.

    (A cache hit skips our pass, so its counters would stay empty.)
    """
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(
            enable_autograd_cache=False):
        yield
    torch._dynamo.reset()
