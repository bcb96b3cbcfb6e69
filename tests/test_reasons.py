"""One list of reasons: every reason the code can leave a block with is in
``inductor_gqa/find/reasons.py``, every entry there is used, and the README's table is that
list (so the docs cannot drift)."""

import pathlib
import re

from inductor_gqa.find import reasons

ROOT = pathlib.Path(__file__).resolve().parents[1]
_RAISED = re.compile(r'(?:Reject|NotAttention)\(\s*"([^"]+)"')
_REPORTED = re.compile(r'\.rejected\(\s*\w+,\s*"([^"]+)"')
_GRAPHS = re.compile(r'"graphs left: ([^"]+)"')


def _sources():
    for folder in ("inductor_gqa", "patterns"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "reasons.py":
                yield path, path.read_text()


def test_every_reason_in_the_code_is_listed_and_every_listed_one_used():
    block, graph = set(), set()
    for path, text in _sources():
        block |= set(_RAISED.findall(text)) | set(_REPORTED.findall(text))
        graph |= set(_GRAPHS.findall(text))
    assert block - set(reasons.REASONS) == set(), "add these to find/reasons.py"
    assert set(reasons.REASONS) - block == set(), "listed in find/reasons.py but never raised"
    assert graph == set(reasons.GRAPH_REASONS)
    assert {"unsupported dtype", "softmax not followed by @ v"} <= set(reasons.REASONS)


def test_the_readme_lists_them():
    readme = (ROOT / "README.md").read_text()
    assert reasons.markdown() in readme, (
        "README.md's reasons table differs from inductor_gqa/find/reasons.py; paste the output "
        "of: python -m inductor_gqa.find.reasons")
