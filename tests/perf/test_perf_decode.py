"""The decode suite end to end on the CPU at tiny sizes (``python -m perf.decode --smoke``): a
static-cache decode step of a 4-layer Llama compiled by the backend, every block fused, logits
within the tolerance of eager's, and the suite's exit status; the decode kernel bench's
refusal without a GPU."""

import json

import pytest
import torch

from perf import decode, decode_kernel

pytest.importorskip("transformers")


def test_decode_step_with_a_static_cache_is_fused(tmp_path):
    rc = decode.main(["--smoke", "--models", "llama", "--impls", "eager,ours", "--tokens", "2",
                      "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "decode.json").read_text())["rows"]
    ours = [r for r in rows if r["impl"] == "ours"]
    assert rc == 0, rows
    assert ours and all(r["fused_blocks"] == 4 and r["passed"] for r in ours), ours


def test_bad_selection_is_refused():
    with pytest.raises(SystemExit, match="unknown model"):
        decode.main(["--models", "gpt5"])
    with pytest.raises(SystemExit, match="unknown implementation"):
        decode.main(["--impls", "fastest"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_kernel_bench_needs_a_gpu(capsys):
    assert decode_kernel.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
