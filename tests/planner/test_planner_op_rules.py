"""Axis rules and FLOPs of single ops (TF-free): Einsum with `...`, IdentityN, linear sums."""

from tf_fusionstitch.planner import ir, op_rules


def _t(shape):
    return ir.Tensor("t", tuple(shape), "float32", 4)


def _op(op_type, **attrs):
    return ir.Op("op", op_type, [], [], attrs)


def test_einsum_ellipsis_is_spelled_out_right_aligned():
    assert op_rules.einsum_terms("...b,bc->...c", [_t((2, 3, 4)), _t((4, 5))],
                                 [_t((2, 3, 5))]) == (["ABb", "bc"], "ABc")
    # An ellipsis covering fewer axes in one operand takes the innermost letters.
    assert op_rules.einsum_terms("...ab,...bc->...ac", [_t((7, 2, 3, 4)), _t((9, 4, 5))],
                                 [_t((7, 9, 3, 5))]) == (["ABab", "Bbc"], "ABac")
    assert op_rules.einsum_terms("ab,bc", [_t((2, 3)), _t((3, 4))], [_t((2, 4))]) is None
    assert op_rules.einsum_terms("abc,bc->a", [_t((2, 3)), _t((3, 4))], [_t((2,))]) is None


def test_einsum_dense_rule_ties_batch_and_contracts_the_input_axis():
    ins, outs = [_t((8, 16, 32)), _t((32, 4, 8))], [_t((8, 16, 4, 8))]
    rule = op_rules.axis_rule(_op("Einsum", equation="...b,bnh->...nh"), ins, outs)
    assert ((("i", 0), 0), (("o", 0), 0)) in rule.ties
    assert ((("i", 0), 2), (("i", 1), 0)) in rule.ties
    assert ((("i", 1), 1), (("o", 0), 2)) in rule.ties
    assert rule.contract == [(0, 2), (1, 0)]
    assert rule.whole == []
    flops, _ = op_rules.flops_and_bytes(_op("Einsum", equation="...b,bnh->...nh"), ins, outs)
    assert flops == 2.0 * 8 * 16 * 32 * 4 * 8


def test_einsum_size_one_axes_tie_nothing():
    # A broadcast operand (size 1 where the other has 8) is tied on no axis there.
    ins, outs = [_t((1, 16, 32)), _t((8, 32, 4))], [_t((8, 16, 4))]
    rule = op_rules.axis_rule(_op("Einsum", equation="bij,bjk->bik"), ins, outs)
    assert all((("i", 0), 0) not in pair for pair in rule.ties)
    assert ((("i", 1), 0), (("o", 0), 0)) in rule.ties


def test_identity_n_ties_each_output_to_its_input_and_passes_partial_sums():
    ins = [_t((4, 6)), _t((6,))]
    rule = op_rules.axis_rule(_op("IdentityN"), ins, [_t((4, 6)), _t((6,))])
    assert rule.ties == [((("i", 0), 0), (("o", 0), 0)), ((("i", 0), 1), (("o", 0), 1)),
                         ((("i", 1), 0), (("o", 1), 0))]
    assert rule.whole == [] and rule.pass_partial


def test_linear_reductions_pass_partial_sums_and_others_do_not():
    ins, outs = [_t((8, 16, 32)), _t((1,))], [_t((16, 32))]
    for op_type, linear in (("Sum", True), ("Mean", True), ("Max", False)):
        rule = op_rules.axis_rule(_op(op_type, axes=[0]), ins, outs)
        assert rule.pass_partial is linear, op_type
        assert (rule.contract, rule.whole) == (([(0, 0)], []) if linear else ([], [(0, 0)]))
    # A sum over no axes (a gradient's BroadcastGradientArgs with nothing broadcast).
    rule = op_rules.axis_rule(_op("Sum", axes=[]), [_t((8, 16)), _t((0,))], [_t((8, 16))])
    assert rule.ties == [((("i", 0), 0), (("o", 0), 0)), ((("i", 0), 1), (("o", 0), 1))]
