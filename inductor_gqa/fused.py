"""Is my model fused? ``fused_blocks(compiled)`` reads it from the compiled artifact.

Our pass runs while Inductor compiles a graph; on a warm FX graph cache Inductor loads the
compiled graph instead and the pass does not run. So the backend keeps, for each graph it
compiled, the blocks our pass found in it (``Block``: module path, fused or left with the
reason), keyed by the hash of Inductor's output code, in memory and on disk beside Inductor's
cache. A later compile that loads the same code (a cache hit) finds them there and counts them
as a fresh compile would (``counters["inductor_gqa"]``). ``fused_blocks`` follows what
``torch.compile`` returned, after it has been called, to the functions Dynamo installed and
from them to Inductor's compiled graphs, and reads each one's record; where none exists (a
cache filled by an older version), the fused op's calls in the output code are counted, named
``<block N>``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import types
from typing import Iterable, Optional

import torch

from .find import report

log = logging.getLogger("inductor_gqa")

_OPS = ("inductor_gqa.attention_block.default(", "inductor_gqa.attention_core.default(")


@dataclasses.dataclass(frozen=True)
class Block:
    path: str                  # module path (model.layers.3.self_attn)
    fused: bool
    reason: str = ""           # why it was left


_memory: dict = {}             # output-code hash -> tuple of Blocks


def _record_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return os.path.join(cache_dir(), "inductor_gqa_blocks")


def output_codes(compiled, depth: int = 8) -> list:
    """Inductor's compiled graphs (``OutputCode``) inside what ``compile_fx`` returned: its
    wrappers' closures and attributes, searched a few levels deep."""
    from torch._inductor.output_code import OutputCode

    found, seen = [], set()

    def walk(obj, d):
        if obj is None or id(obj) in seen or d > depth or isinstance(obj, (
                str, bytes, int, float, types.ModuleType, torch.Tensor, torch.nn.Module)):
            return
        # classes only where AOTAutograd keeps compiled graphs: its autograd.Function
        if isinstance(obj, type) and not issubclass(obj, torch.autograd.Function):
            return
        seen.add(id(obj))
        if isinstance(obj, OutputCode):
            found.append(obj)
            return
        kids = []
        if isinstance(obj, types.FunctionType):
            kids += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        if isinstance(obj, (list, tuple)):
            kids += list(obj)
        elif isinstance(obj, dict):
            kids += list(obj.values())
        elif isinstance(obj, type):
            kids += [v for k, v in vars(obj).items() if not k.startswith("__")]
        else:
            kids += [getattr(obj, a) for a in ("__wrapped__", "__self__", "func")
                     if hasattr(obj, a)]
            try:
                kids += list(vars(obj).values())
            except TypeError:
                pass
        for k in kids:
            walk(k, d + 1)

    walk(compiled, 0)
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _key(code) -> Optional[str]:
    src = getattr(code, "source_code", None)
    return hashlib.sha256(src.encode()).hexdigest() if isinstance(src, str) else None


def remember(codes: list, blocks: tuple) -> None:
    """Keep ``blocks`` as those of the graphs whose output code is ``codes``."""
    for code in codes:
        key = _key(code)
        if key is None:
            continue
        _memory[key] = blocks
        try:
            os.makedirs(_record_dir(), exist_ok=True)
            path = os.path.join(_record_dir(), key + ".json")
            with open(path + ".tmp", "w") as f:
                json.dump([dataclasses.asdict(b) for b in blocks], f)
            os.replace(path + ".tmp", path)
        except OSError as e:            # the record is a convenience; compiling goes on
            log.debug("inductor_gqa: could not keep the fused blocks' record: %s", e)


def recall(codes: list) -> Optional[tuple]:
    """The blocks kept for these output codes, or None when none were kept."""
    for code in codes:
        key = _key(code)
        if key is None:
            continue
        if key in _memory:
            return _memory[key]
        try:
            with open(os.path.join(_record_dir(), key + ".json")) as f:
                blocks = tuple(Block(**b) for b in json.load(f))
        except (OSError, ValueError, TypeError):
            continue
        _memory[key] = blocks
        return blocks
    return None


def _counted_in_code(codes: list) -> tuple:
    n = sum(code.source_code.count(op) for code in codes
            for op in _OPS if isinstance(getattr(code, "source_code", None), str))
    return tuple(Block(f"<block {i}>", True) for i in range(n))


def after_compile(compiled, rows: list, pass_ran: bool):
    """What the backend does with ``compile_fx``'s result: the blocks of this compile are the
    report's rows when our pass ran (kept for later cache hits), else (a cache hit) the ones
    kept for the same output code, counted now as the pass would have."""
    codes = output_codes(compiled)
    if rows or pass_ran:
        blocks = tuple(Block(r.block, r.fused, r.reason) for r in rows)
        remember(codes, blocks)
    else:
        blocks = recall(codes)
        if blocks is None:
            blocks = _counted_in_code(codes)
        elif blocks:
            for b in blocks:
                report.count_row(report.Row(b.path, b.fused, b.reason))
            fused = sum(b.fused for b in blocks)
            log.info("fused %d of %d attention blocks (FX graph cache hit: as compiled "
                     "before)", fused, len(blocks))
    return compiled


def _compiled_functions(obj) -> Iterable:
    """The functions Dynamo installed for ``obj`` (what ``torch.compile`` returned, called at
    least once): those named in the cache entries of its code (and its submodules' forward
    code, where a graph break started a new frame), resume functions followed."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    root = getattr(obj, "_orig_mod", None) or getattr(obj, "_torchdynamo_orig_callable", obj)
    fns = []
    if isinstance(root, torch.nn.Module):
        seen_types = set()
        for m in root.modules():
            if type(m) not in seen_types:
                seen_types.add(type(m))
                fns.append(type(m).forward)
    else:
        fns.append(getattr(root, "__func__", root))
    seen_codes = set()
    while fns:
        fn = fns.pop()
        code = getattr(fn, "__code__", None)
        if code is None or code in seen_codes:
            continue
        seen_codes.add(code)
        for entry in _debug_get_cache_entry_list(code):
            for name in entry.code.co_names:
                g = fn.__globals__.get(name)
                if name.startswith("__compiled_fn") and g is not None:
                    yield g
                elif name.startswith("__resume_at") and g is not None:
                    fns.append(g)


def fused_blocks(compiled) -> list:
    """The module paths of the attention blocks fused in ``compiled``: what
    ``torch.compile(model, backend="inductor_gqa")`` returned, after it has been called (cold
    or warm FX graph cache alike), or a ``torch.fx.GraphModule`` (the fused op's calls in its
    graph). Each block once, sorted; ``[]`` when nothing was fused or nothing was compiled
    yet."""
    if isinstance(compiled, torch.fx.GraphModule):
        ops = (torch.ops.inductor_gqa.attention_block.default,
               torch.ops.inductor_gqa.attention_core.default)
        paths = set()
        for i, n in enumerate(n for n in compiled.graph.nodes
                              if n.op == "call_function" and n.target in ops):
            stack = n.meta.get("nn_module_stack")
            paths.add(report.module_path(n) if stack else f"<block {i}>")
        return sorted(paths)
    paths = set()
    for fn in _compiled_functions(compiled):
        codes = output_codes(fn)
        blocks = recall(codes)
        paths.update(b.path for b in (blocks if blocks is not None else _counted_in_code(codes))
                     if b.fused)
    return sorted(paths)
