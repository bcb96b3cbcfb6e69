"""The pass as a user meets it: what the rewritten graph holds, cache keys, install/chaining."""

import torch
from expecttest import assert_expected_inline
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

import inductor_gqa
from inductor_gqa import workloads as wl
from inductor_gqa.find.dump import readable
from inductor_gqa.graph_pass import AttentionBlockPass

SMALL = dict(num_heads=4, num_kv_heads=2, head_dim=32)


class Recorder(CustomGraphPass):
    """A user's own joint-graph pass: records the graph it sees (after ours)."""

    def __init__(self):
        self.dumps = []

    def __call__(self, graph):
        self.dumps.append(readable(graph))

    def uuid(self):
        return "recorder"


def _rewritten(workload, options=None):
    rec = Recorder()
    fn = wl.workload_fn(workload, **SMALL)
    inputs = wl.make_inputs(workload, 9, 2, hidden=128, **SMALL)
    with inductor_config.patch(joint_custom_pre_pass=rec), inductor_gqa.installed(options):
        with torch.no_grad():
            torch.compile(fn)(**inputs)
    assert len(rec.dumps) == 1
    return rec.dumps[0]


def test_w075_graph_holds_one_fused_call():
    assert_expected_inline(_rewritten(wl.W075), """\
attention_block(x=arg0_1, wq=arg1_1, wk=arg2_1, wv=arg3_1, inv_freq=arg4_1, position_ids=arg5_1, wo=arg6_1)
    num_heads=4, num_kv_heads=2, head_dim=32, norm='none', eps=1e-06, norm_scope='head', rope='half', rotary_dim=32, rope_fp32=False, core='explicit', scale=1.0, scale_op='mul', causal=False, window=0, softcap=0.0, mask='none', mask_fill=-inf, return_probs=True, cache='none'
other ops: getitem x2""")


def test_w075_keeps_the_models_cos_sin_table_when_asked():
    assert_expected_inline(_rewritten(wl.W075, inductor_gqa.Options(rope_from_positions=False)),
                           """\
attention_block(x=arg0_1, wq=arg1_1, wk=arg2_1, wv=arg3_1, cos=cos, sin=sin, wo=arg6_1)
    num_heads=4, num_kv_heads=2, head_dim=32, norm='none', eps=1e-06, norm_scope='head', rope='half', rotary_dim=32, rope_fp32=False, core='explicit', scale=1.0, scale_op='mul', causal=False, window=0, softcap=0.0, mask='none', mask_fill=-inf, return_probs=True, cache='none'
other ops: clone.default x1, convert_element_type.default x1, cos.default x1, expand.default x2, getitem x2, mul.Tensor x1, permute.default x1, sin.default x1, unsqueeze.default x4, view.default x1""")


def test_w092_graph_holds_one_fused_call():
    assert_expected_inline(_rewritten(wl.W092), """\
attention_block(x=arg0_1, wq=arg1_1, wk=arg3_1, wv=arg5_1, bq=arg2_1, bk=arg4_1, bv=arg6_1, q_norm_weight=arg7_1, k_norm_weight=arg8_1, cos=arg9_1, sin=arg10_1, wo=arg11_1)
    num_heads=4, num_kv_heads=2, head_dim=32, norm='fp32_weight', eps=1e-05, norm_scope='head', rope='half', rotary_dim=32, rope_fp32=False, core='explicit', scale=0.1767766952966369, scale_op='mul', causal=True, window=0, softcap=0.0, mask='none', mask_fill=-inf, return_probs=False, cache='none'
other ops: getitem x1""")


def test_uuid_covers_options_and_chained_pass():
    base = AttentionBlockPass().uuid()
    assert base is not None
    assert AttentionBlockPass(inductor_gqa.Options(fuse_sdpa=False)).uuid() != base
    assert AttentionBlockPass(inductor_gqa.Options(head_dims=(64,))).uuid() != base
    assert AttentionBlockPass(chain=Recorder()).uuid() != base
    assert AttentionBlockPass(before_autograd=True).uuid() != base
    assert AttentionBlockPass(inductor_gqa.Options(fuse_with_grad=False)).uuid() != base
    # a plain callable cannot be hashed: None makes Inductor bypass its cache
    assert AttentionBlockPass(chain=lambda g: None).uuid() is None
    # newer Inductor accepts a list of passes: each is chained and hashed
    assert AttentionBlockPass(chain=[Recorder(), Recorder()]).uuid() is not None
    assert AttentionBlockPass(chain=[Recorder(), lambda g: None]).uuid() is None


def test_install_chains_and_restores_a_user_pass():
    rec = Recorder()
    with inductor_config.patch(joint_custom_pre_pass=rec):
        inductor_gqa.install()
        try:
            current = inductor_config.joint_custom_pre_pass
            assert isinstance(current, AttentionBlockPass) and current.chain is rec
            inductor_gqa.install()           # installing twice does not chain us to ourselves
            assert inductor_config.joint_custom_pre_pass.chain is rec
        finally:
            inductor_gqa.uninstall()
        assert inductor_config.joint_custom_pre_pass is rec


def test_backend_is_registered_by_entry_point_name():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("inductor_gqa") is inductor_gqa.inductor_gqa_backend


def test_op_rejects_bad_spec():
    import pytest
    from inductor_gqa.plan.spec import BlockSpec

    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        BlockSpec(num_heads=6, num_kv_heads=4, head_dim=32)
    with pytest.raises(ValueError, match="rope must be one of"):
        BlockSpec(num_heads=4, num_kv_heads=2, head_dim=32, rope="yarn", rotary_dim=32)


def _spec_line(dump: str) -> str:
    """One line per fused call: the tensor arguments given and the scalars that vary."""
    lines = dump.splitlines()
    call = lines[0][len("attention_block("):-1]
    tensors = " ".join(a.split("=")[0] for a in call.split(", ") if a.split("=")[0] != "x")
    spec = dict(kv.split("=", 1) for kv in lines[1].strip().split(", "))
    keep = ("norm", "norm_scope", "rope", "rotary_dim", "rope_fp32", "core", "scale_op", "causal",
            "window", "softcap", "mask", "return_probs")
    return f"{tensors} | " + " ".join(f"{k}={spec[k]}" for k in keep)


def test_every_variant_rewrites_to_the_expected_call():
    from variants import FUSED, build

    out = []
    for v in FUSED:
        torch._dynamo.reset()
        rec = Recorder()
        fn, inputs = build(v)
        with inductor_config.patch(joint_custom_pre_pass=rec), inductor_gqa.installed():
            with torch.no_grad():
                torch.compile(fn)(**inputs)
        assert len(rec.dumps) == 1 and rec.dumps[0].count("attention_block(") == 1, v.name
        out.append(f"{v.name}: {_spec_line(rec.dumps[0])}")
    assert_expected_inline("\n".join(out), """\
linear_bias_sdpa_causal: wq wk wv bq bk bv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='sdpa' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
sdpa_enable_gqa_bool_mask: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='sdpa' scale_op='mul' causal=False window=0 softcap=0.0 mask='bool_keep' return_probs=False
sdpa_additive_mask_input: wq wk wv cos sin attn_mask wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='sdpa' scale_op='mul' causal=False window=0 softcap=0.0 mask='additive' return_probs=False
sdpa_repeat_interleave: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='sdpa' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
mha_explicit: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
matmul_t_bias: wq wk wv bq bk bv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
fused_qkv_split: wq wk wv bq bk bv cos sin wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
fused_qkv_slice: wq wk wv cos sin wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_after_transpose: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_cast_weight_bf16: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='cast_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_one_plus_weight: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_one_plus_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='none' return_probs=False
rope_inv_freq_probs: wq wk wv inv_freq position_ids wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='none' return_probs=True
rope_interleaved: wq wk wv cos sin wo | norm='none' norm_scope='head' rope='interleaved' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
rope_partial: wq wk wv cos sin wo | norm='none' norm_scope='head' rope='half' rotary_dim=8 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
scale_div: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='div' causal=True window=0 softcap=0.0 mask='none' return_probs=False
bool_mask_input: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='bool_fill' return_probs=True
additive_mask_input: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='additive' return_probs=False
causal_and_padding: wq wk wv q_norm_weight k_norm_weight cos sin attn_mask wo | norm='fp32_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='additive' return_probs=False
no_o_proj: wq wk wv cos sin | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
o_proj_bias: wq wk wv cos sin wo bo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='none' return_probs=False
ends_at_heads: wq wk wv | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
fp16_sdpa: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='sdpa' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
fused_qkv_chunk: wq wk wv cos sin wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
gptj_unbind: wq wk wv bq bk bv cos sin wo | norm='none' norm_scope='head' rope='interleaved' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
neox_heads_layout: wq wk wv bq bk bv cos sin wo | norm='none' norm_scope='head' rope='half' rotary_dim=8 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_promoted_bf16: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
rope_fp32_bf16: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='proj' rope='half' rotary_dim=16 rope_fp32=True core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_recip_sqrt: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_sum_div: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
norm_over_projection: wq wk wv q_norm_weight k_norm_weight cos sin wo | norm='fp32_weight' norm_scope='proj' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
scale_first: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
dropout_eval: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
dropout_p0: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
keep_where_mask: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='bool_keep' return_probs=True
sliding_window: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=3 softcap=0.0 mask='none' return_probs=False
chunked_mask_as_tensor: wq wk wv cos sin attn_mask wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='bool_fill' return_probs=False
window_and_padding: wq wk wv cos sin attn_mask wo | norm='none' norm_scope='head' rope='half' rotary_dim=16 rope_fp32=False core='explicit' scale_op='mul' causal=True window=3 softcap=0.0 mask='bool_fill' return_probs=False
softcap: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=30.0 mask='none' return_probs=False
softcap_recip: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=30.0 mask='additive' return_probs=False
padded_rows_inf: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=True window=0 softcap=0.0 mask='bool_fill' return_probs=True
padded_rows_min: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='explicit' scale_op='mul' causal=False window=0 softcap=0.0 mask='additive' return_probs=True
padded_rows_sdpa: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='sdpa' scale_op='mul' causal=True window=0 softcap=0.0 mask='bool_keep' return_probs=False
cudnn_converted_causal: wq wk wv wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='sdpa' scale_op='mul' causal=True window=0 softcap=0.0 mask='none' return_probs=False
cudnn_converted_padding: wq wk wv attn_mask wo | norm='none' norm_scope='head' rope='none' rotary_dim=0 rope_fp32=False core='sdpa' scale_op='mul' causal=False window=0 softcap=0.0 mask='additive' return_probs=False""")
