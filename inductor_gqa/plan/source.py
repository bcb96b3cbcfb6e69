"""The hash of this package's sources: it keys the FX graph cache (the pass's ``uuid()``) and
the compile-time tunings kept on disk (``tune.py``), so a new version of any file re-plans."""

from __future__ import annotations

import hashlib
import pathlib
from typing import Optional

from .. import patterns

_PACKAGE = pathlib.Path(__file__).parents[1]
_PATTERNS = pathlib.Path(patterns.__file__).parent


def source_hash() -> str:
    """Hash of every source file the pass and the fused op depend on (patterns, kernels and the
    config tables too)."""
    h = hashlib.sha256()
    files = sorted(set(_PACKAGE.rglob("*.py")) | set(_PACKAGE.rglob("*.json"))
                   | set(_PATTERNS.rglob("*.py")))
    for f in files:
        h.update(str(f.relative_to(f.parents[1])).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_SOURCE_HASH: Optional[str] = None


def cached_source_hash() -> str:
    """``source_hash()``, computed once per process."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        _SOURCE_HASH = source_hash()
    return _SOURCE_HASH
