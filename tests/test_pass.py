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
    assert_expected_inline(_rewritten(wl.W075, inductor_gqa.Options(rope_from_positions=True)), """\
attention_block(x=arg0_1, wq=arg1_1, wk=arg2_1, wv=arg3_1, inv_freq=arg4_1, position_ids=arg5_1, wo=arg6_1)
    num_heads=4, num_kv_heads=2, head_dim=32, norm='none', eps=1e-06, rope='half', rotary_dim=32, core='explicit', scale=1.0, scale_op='mul', causal=False, mask='none', mask_fill=-inf, return_probs=True
other ops: getitem x2""")


def test_w092_graph_holds_one_fused_call():
    assert_expected_inline(_rewritten(wl.W092), """\
attention_block(x=arg0_1, wq=arg1_1, wk=arg3_1, wv=arg5_1, bq=arg2_1, bk=arg4_1, bv=arg6_1, q_norm_weight=arg7_1, k_norm_weight=arg8_1, cos=arg9_1, sin=arg10_1, wo=arg11_1)
    num_heads=4, num_kv_heads=2, head_dim=32, norm='fp32_weight', eps=1e-05, rope='half', rotary_dim=32, core='explicit', scale=0.1767766952966369, scale_op='mul', causal=True, mask='none', mask_fill=-inf, return_probs=False
other ops: getitem x1""")


def test_uuid_covers_options_and_chained_pass():
    base = AttentionBlockPass().uuid()
    assert base is not None
    assert AttentionBlockPass(inductor_gqa.Options(fuse_sdpa=False)).uuid() != base
    assert AttentionBlockPass(inductor_gqa.Options(head_dims=(64,))).uuid() != base
    assert AttentionBlockPass(chain=Recorder()).uuid() != base
    # a plain callable cannot be hashed: None makes Inductor bypass its cache
    assert AttentionBlockPass(chain=lambda g: None).uuid() is None


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


def test_w075_default_keeps_the_cos_sin_table_in_the_graph():
    dump = _rewritten(wl.W075)
    assert "cos=" in dump and "inv_freq=" not in dump
