"""Entry point of the ``torch_dynamo_backends`` group (see pyproject.toml)."""

from .install import inductor_gqa_backend

__all__ = ["inductor_gqa_backend"]
