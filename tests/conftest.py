import os

# Triton kernels run on CPU tensors through the interpreter; this must be set before any kernel
# module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
