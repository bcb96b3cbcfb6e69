"""An installed wheel works on its own: the patterns ship inside it and the backend is found by
name through the entry point, with no import of inductor_gqa by the user."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# the user's script: tiny_block.py's source, then a compile with the backend named by string
USER_CODE = (pathlib.Path(__file__).with_name("tiny_block.py").read_text() + r"""
args = block_args()
with torch.no_grad():
    out = torch.compile(block, backend="inductor_gqa")(*args)
    torch.testing.assert_close(out, block(*args), rtol=1e-5, atol=1e-5)
import sys, inductor_gqa
from torch._dynamo.utils import counters
print(inductor_gqa.__file__)
print(dict(counters["inductor_gqa"]))
""")


def test_installed_wheel_entry_point_and_patterns(tmp_path):
    dist, site = tmp_path / "dist", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                          str(ROOT)], check=True, cwd=tmp_path)
    wheel = next(dist.glob("inductor_gqa-*.whl"))
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   cwd=tmp_path)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "0", "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", USER_CODE], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    file_line, counts = r.stdout.strip().splitlines()[-2:]
    assert file_line.startswith(str(site)), file_line      # the wheel, not the source tree
    assert "'blocks_fused': 1" in counts, counts
