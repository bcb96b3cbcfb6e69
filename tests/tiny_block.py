"""A small GQA attention block in plain PyTorch (SDPA with enable_gqa, causal), for the tests
that compile it end to end. test_install.py runs this file's source in a fresh interpreter."""

import torch
import torch.nn.functional as F


def block(x, wq, wk, wv, wo):
    b, s, _ = x.shape
    q = F.linear(x, wq).view(b, s, 4, 16).transpose(1, 2)
    k = F.linear(x, wk).view(b, s, 2, 16).transpose(1, 2)
    v = F.linear(x, wv).view(b, s, 2, 16).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.linear(o.transpose(1, 2).reshape(b, s, 64), wo)


def block_args():
    return [torch.randn(2, 5, 32), torch.randn(64, 32), torch.randn(32, 32),
            torch.randn(32, 32), torch.randn(32, 64)]
