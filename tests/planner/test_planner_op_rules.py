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


def test_strided_slice_with_masks_maps_axes():
    # x[:, 0, 2:5, ..., tf.newaxis] on (8, 16, 32, 4, 6): axis 1 indexed away, axis 2 cut,
    # the ellipsis covers axes 3 and 4, and a new axis ends the output.
    op = _op("StridedSlice", strides=[1, 1, 1, 1, 1], shrink_axis_mask=0b10,
             ellipsis_mask=0b1000, new_axis_mask=0b10000)
    assert op_rules.strided_slice_axes(op, 5) == [(0, 0), (1, None), (2, 1), (3, 2), (4, 3),
                                                  (None, 4)]
    x, y = _t((8, 16, 32, 4, 6)), _t((8, 3, 4, 6, 1))
    rule = op_rules.axis_rule(op, [x, _t((5,)), _t((5,)), _t((5,))], [y])
    assert rule.ties == [((("i", 0), 0), (("o", 0), 0)), ((("i", 0), 3), (("o", 0), 2)),
                         ((("i", 0), 4), (("o", 0), 3))]
    assert rule.whole == [(0, 1), (0, 2)] and not rule.conservative
    # Its gradient reads the same axes the other way: dy's cut axis is needed whole.
    grad = _op("StridedSliceGrad", strides=[1, 1, 1, 1, 1], shrink_axis_mask=0b10,
               ellipsis_mask=0b1000, new_axis_mask=0b10000)
    rule = op_rules.axis_rule(grad, [_t((5,))] * 4 + [y], [x])
    assert ((("o", 0), 0), (("i", 4), 0)) in rule.ties and rule.whole == [(4, 1)]
    # A reversal is not the same axis: the conservative rule.
    rev = _op("StridedSlice", strides=[-1])
    assert op_rules.axis_rule(rev, [_t((8,))] + [_t((1,))] * 3, [_t((8,))]).conservative


def test_pack_unpack_and_split_tie_every_other_axis():
    rule = op_rules.axis_rule(_op("Pack", axis=1), [_t((8, 4)), _t((8, 4))], [_t((8, 2, 4))])
    assert ((("i", 1), 1), (("o", 0), 2)) in rule.ties and len(rule.ties) == 4
    rule = op_rules.axis_rule(_op("Unpack", axis=-1), [_t((8, 4, 2))],
                              [_t((8, 4)), _t((8, 4))])
    assert ((("o", 1), 1), (("i", 0), 1)) in rule.ties and rule.whole == [(0, 2)]
    rule = op_rules.axis_rule(_op("Split", axis=-1), [_t(()), _t((8, 6))],
                              [_t((8, 3)), _t((8, 3))])
    assert rule.ties == [((("i", 1), 0), (("o", 0), 0)), ((("i", 1), 0), (("o", 1), 0))]
    assert rule.whole == [(1, 1)]


def test_generators_and_metadata_bind_no_axis():
    for op_type in ("StatelessRandomUniformV2", "InvertPermutation"):
        rule = op_rules.axis_rule(_op(op_type), [_t((3,)), _t((2,))], [_t((8, 16, 32))])
        assert (rule.ties, rule.whole, rule.conservative) == ([], [], False), op_type


def test_conservative_ops_counts_the_fallbacks_that_bind_an_axis():
    g = ir.Graph("g")
    for name, shape in (("x", (8, 4)), ("s", ())):
        g.add_tensor(ir.Tensor(name, shape, "float32", 4))
        g.add_op(ir.Op(name + "_op", "Placeholder", [], [name]))
    for k, (op_type, src) in enumerate((("Mystery", "x"), ("Mystery", "x"), ("Enigma", "x"),
                                        ("Mystery", "s"), ("Relu", "x"))):
        g.add_tensor(ir.Tensor(f"y{k}", (8, 4), "float32", 4))
        g.add_op(ir.Op(f"op{k}", op_type, [src], [f"y{k}"]))
    g.inputs, g.outputs = ["x"], ["y4"]
    # A scalar input (op3) binds nothing; Relu has its rule.
    assert op_rules.conservative_ops(g.finalize()) == {"Mystery": 2, "Enigma": 1}


def test_convolution_and_its_backprops_tie_channels_and_cost_the_same():
    x, f, y = _t((8, 32, 32, 16)), _t((3, 3, 16, 64)), _t((8, 16, 16, 64))
    sizes = _t((4,))
    cases = {"Conv2D": ([x, f], [y]), "Conv2DBackpropInput": ([sizes, f, y], [x]),
             "Conv2DBackpropFilter": ([x, sizes, y], [f])}
    flops = {t: op_rules.flops_and_bytes(_op(t), i, o)[0] for t, (i, o) in cases.items()}
    assert set(flops.values()) == {2.0 * 8 * 16 * 16 * 64 * 3 * 3 * 16}, flops
    fwd = op_rules.axis_rule(_op("Conv2D"), [x, f], [y])
    assert fwd.ties == [((("i", 0), 0), (("o", 0), 0)), ((("i", 0), 3), (("i", 1), 2)),
                        ((("i", 1), 3), (("o", 0), 3))]
    assert fwd.contract == [(1, 0), (1, 1), (0, 3), (1, 2)]
    assert fwd.whole == [(0, 1), (0, 2)]
    dx = op_rules.axis_rule(_op("Conv2DBackpropInput"), [sizes, f, y], [x])
    assert ((("i", 1), 3), (("i", 2), 3)) in dx.ties and (2, 3) in dx.contract
    assert dx.whole == [(2, 1), (2, 2)]
    df = op_rules.axis_rule(_op("Conv2DBackpropFilter"), [x, sizes, y], [f])
    assert ((("i", 0), 3), (("o", 0), 2)) in df.ties and df.contract == [(0, 0), (2, 0)]
    # NCHW: channels on axis 1.
    nchw = op_rules.axis_rule(_op("Conv2D", data_format="NCHW"),
                              [_t((8, 16, 32, 32)), f], [_t((8, 64, 16, 16))])
    assert ((("i", 1), 3), (("o", 0), 1)) in nchw.ties and nchw.whole == [(0, 2), (0, 3)]


def test_depthwise_convolution_keeps_channels_one_axis():
    x, f, y = _t((8, 32, 32, 16)), _t((3, 3, 16, 1)), _t((8, 32, 32, 16))
    rule = op_rules.axis_rule(_op("DepthwiseConv2dNative"), [x, f], [y])
    assert ((("i", 0), 3), (("o", 0), 3)) in rule.ties and rule.contract == [(1, 0), (1, 1)]
    flops, _ = op_rules.flops_and_bytes(_op("DepthwiseConv2dNative"), [x, f], [y])
    assert flops == 2.0 * 8 * 32 * 32 * 16 * 9


def test_fused_batch_norm_ties_channels_and_needs_the_statistics_axes_whole():
    x, c = _t((8, 16, 16, 32)), _t((32,))
    rule = op_rules.axis_rule(_op("FusedBatchNormV3"), [x, c, c, c, c],
                              [x, c, c, c, c, _t((0,))])
    assert ((("i", 0), 3), (("i", 1), 0)) in rule.ties
    assert ((("i", 0), 3), (("o", 1), 0)) in rule.ties
    assert ((("i", 0), 2), (("o", 0), 2)) in rule.ties
    assert rule.whole == [(0, 0), (0, 1), (0, 2)] and not rule.conservative
    grad = op_rules.axis_rule(_op("FusedBatchNormGradV3"), [x, x, c, c, c, _t((0,))],
                              [x, c, c, _t((0,)), _t((0,))])
    assert ((("i", 1), 3), (("o", 0), 3)) in grad.ties
    assert ((("i", 0), 3), (("o", 2), 0)) in grad.ties
    assert (1, 0) in grad.whole and (0, 2) in grad.whole


def test_gather_with_batch_dims_ties_the_batch_axes():
    # take_along_axis: params (2, 4, 16, 32), indices (2, 4, 16, 8), batch_dims 3, axis 3.
    params, indices, out = _t((2, 4, 16, 32)), _t((2, 4, 16, 8)), _t((2, 4, 16, 8))
    rule = op_rules.axis_rule(_op("GatherV2", axis=3, batch_dims=3),
                              [params, indices, _t(())], [out])
    assert rule.ties == [((("i", 0), a), (("o", 0), a)) for a in range(3)] + \
        [((("i", 1), a), (("o", 0), a)) for a in range(3)] + [((("i", 1), 3), (("o", 0), 3))]
    assert rule.contract == [(0, 3)] and not rule.conservative
    # Without batch dims: an embedding lookup, the table's row axis contracted.
    rule = op_rules.axis_rule(_op("GatherV2", axis=0), [_t((100, 32)), _t((8, 16)), _t(())],
                              [_t((8, 16, 32))])
    assert rule.ties == [((("i", 1), 0), (("o", 0), 0)), ((("i", 1), 1), (("o", 0), 1)),
                         ((("i", 0), 1), (("o", 0), 2))]


def test_sparse_update_ties_row_axes_to_the_variable():
    # SGD on an embedding: variable (100, 32) -= updates (8, 16, 32) at indices (8, 16).
    rule = op_rules.axis_rule(_op("ResourceScatterSub"),
                              [_t((100, 32)), _t((8, 16)), _t((8, 16, 32))], [])
    assert rule.ties == [((("i", 1), 0), (("i", 2), 0)), ((("i", 1), 1), (("i", 2), 1)),
                         ((("i", 0), 1), (("i", 2), 2))]
    assert rule.whole == [] and not rule.conservative
    # Of a (1000, 32) table only the 8 * 16 indexed rows are read, updated and written back;
    # the updates are read once.
    table, indices, updates = _t((1000, 32)), ir.Tensor("i", (8, 16), "int32", 4), \
        _t((8, 16, 32))
    flops, moved = op_rules.flops_and_bytes(_op("ResourceScatterSub"),
                                            [table, indices, updates], [])
    assert (flops, moved) == (8 * 16 * 32, 3 * 8 * 16 * 32 * 4 + 8 * 16 * 4)
    # A scalar update (TF applies it to every indexed row) does the same arithmetic.
    assert op_rules.flops_and_bytes(_op("ResourceScatterAdd"), [table, indices, _t(())],
                                    [])[0] == flops
    # An overwrite reads no row; a table with fewer rows than indices (BERT's 2-row segment
    # embedding) is read and written once.
    assert op_rules.flops_and_bytes(_op("ResourceScatterUpdate"), [table, indices, updates],
                                    []) == (0.0, 2 * 8 * 16 * 32 * 4 + 8 * 16 * 4)
    assert op_rules.flops_and_bytes(_op("ResourceScatterAdd"),
                                    [_t((2, 32)), indices, updates], [])[1] == \
        2 * 2 * 32 * 4 + 8 * 16 * 32 * 4 + 8 * 16 * 4


def test_grouped_convolution_keeps_channel_blocks_within_groups():
    # Keras' DepthwiseConv2D on TF: a Conv2D with one input channel per filter (96 groups).
    x, f, y = _t((2, 16, 16, 96)), _t((7, 7, 1, 96)), _t((2, 16, 16, 96))
    rule = op_rules.axis_rule(_op("Conv2D"), [x, f], [y])
    assert ((("i", 0), 3), (("o", 0), 3)) in rule.ties
    assert ((("i", 1), 3), (("o", 0), 3)) in rule.ties
    assert rule.contract == [(1, 0), (1, 1)]      # the window only, not the channels
    dx = op_rules.axis_rule(_op("Conv2DBackpropInput"), [_t((4,)), f, y], [x])
    assert ((("o", 0), 3), (("i", 2), 3)) in dx.ties and dx.contract == [(1, 0), (1, 1)]
    flops, _ = op_rules.flops_and_bytes(_op("Conv2D"), [x, f], [y])
    assert flops == 2.0 * 2 * 16 * 16 * 96 * 49


def test_cumulative_sum_reads_its_axis_whole_and_passes_the_others():
    x = _t((4, 8, 16))
    same = [((("i", 0), a), (("o", 0), a)) for a in range(3)]
    for axis, scanned in ((1, 1), (-1, 2), (-3, 0)):
        rule = op_rules.axis_rule(_op("Cumsum", axis=axis), [x, _t(())], [x])
        assert (rule.ties, rule.whole, rule.contract) == (same, [(0, scanned)], []), axis
    # An axis the importer could not read, or out of range: the conservative rule.
    assert op_rules.axis_rule(_op("Cumsum"), [x, _t(())], [x]).conservative
    assert op_rules.axis_rule(_op("Cumsum", axis=3), [x, _t(())], [x]).conservative


def test_matrix_band_part_reads_the_matrix_axes_whole():
    x = _t((2, 4, 16, 16))
    rule = op_rules.axis_rule(_op("MatrixBandPart"), [x, _t(()), _t(())], [x])
    assert rule.ties == [((("i", 0), a), (("o", 0), a)) for a in range(4)]
    assert rule.whole == [(0, 2), (0, 3)] and not rule.conservative


def test_top_k_ties_the_leading_axes_to_values_and_indices():
    rule = op_rules.axis_rule(_op("TopKV2"), [_t((8, 16, 4)), _t(())],
                              [_t((8, 16, 2)), _t((8, 16, 2))])
    assert rule.ties == [((("i", 0), 0), (("o", 0), 0)), ((("i", 0), 1), (("o", 0), 1)),
                         ((("i", 0), 0), (("o", 1), 0)), ((("i", 0), 1), (("o", 1), 1))]
    assert rule.whole == [(0, 2)] and not rule.conservative


def test_scatter_nd_ties_the_slice_axes_and_sums_over_the_index_batch():
    # indices (8, 16, 2) address the first two axes of a (10, 12, 32) output; updates are
    # (8, 16) slices of shape (32,).
    indices, updates = ir.Tensor("i", (8, 16, 2), "int32", 4), _t((8, 16, 32))
    rule = op_rules.axis_rule(_op("ScatterNd"), [indices, updates, _t((3,))],
                              [_t((10, 12, 32))])
    assert rule.ties == [((("i", 0), 0), (("i", 1), 0)), ((("i", 0), 1), (("i", 1), 1)),
                         ((("i", 1), 2), (("o", 0), 2))]
    assert rule.contract == [(1, 0), (1, 1)] and rule.whole == []
    # Updates that do not fit indices and shape (an index depth read wrong): conservative.
    assert op_rules.axis_rule(_op("ScatterNd"), [indices, _t((8, 16, 12, 32)), _t((3,))],
                              [_t((10, 12, 32))]).conservative
