"""Axis facts and FLOPs of convolutions, pooling and fused batch norm (TF-free).

`op_rules` wraps `axis_facts` in its AxisRule. In every op here the batch axis and the
channel axes are the axes a plan may split: output channels (a filter's last axis) are one
axis with the output's channels, input channels are contracted with the filter's third axis
(a split there leaves partial sums, as a matmul's contracted axis does), and so is the
kernel window. Spatial axes are needed whole: a split there would need halo exchanges, which
the cost model does not price.
"""

import math

CONVOLUTIONS = frozenset("""
Conv2D Conv2DBackpropInput Conv2DBackpropFilter DepthwiseConv2dNative
DepthwiseConv2dNativeBackpropInput DepthwiseConv2dNativeBackpropFilter
""".split())
POOLS = frozenset("MaxPool AvgPool MaxPoolGrad AvgPoolGrad".split())
BATCH_NORMS = frozenset("FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3 FusedBatchNormGrad "
                        "FusedBatchNormGradV2 FusedBatchNormGradV3".split())
OPS = CONVOLUTIONS | POOLS | BATCH_NORMS


def _layout(op, rank):
    """(batch axis, channel axis, spatial axes) of an image tensor of rank `rank`."""
    if str(op.attrs.get("data_format", "NHWC")).startswith("NC"):
        return 0, 1, tuple(range(2, rank))
    return 0, rank - 1, tuple(range(1, rank - 1))


def _tie(p, a, q, b):
    return ((p, a), (q, b))


def axis_facts(op, ins, outs):
    """{"ties", "contract", "whole"} of one op of `OPS` (ports as in `op_rules.AxisRule`)."""
    t = op.type
    if t in CONVOLUTIONS:
        return _convolution(t, op, ins, outs)
    if t in POOLS:
        # Images: the input, or (MaxPoolGrad) input, output and gradient; AvgPoolGrad's
        # first input is a shape.
        images = [k for k, x in enumerate(ins) if x.rank == outs[0].rank]
        n, c, spatial = _layout(op, outs[0].rank)
        ties = [_tie(("i", k), a, ("o", 0), a) for k in images for a in (n, c)]
        whole = [(k, a) for k in images for a in spatial if ins[k].shape[a] > 1]
        return dict(ties=ties, contract=[], whole=whole)
    return _batch_norm(t, op, ins, outs)


def _convolution(t, op, ins, outs):
    depthwise = t.startswith("Depthwise")
    if t.endswith("BackpropInput"):        # (input sizes, filter, dy) -> dx
        image, filt, dy = ("o", 0), ("i", 1), ("i", 2)
        rank = outs[0].rank
    elif t.endswith("BackpropFilter"):     # (x, filter sizes, dy) -> dfilter
        image, filt, dy = ("i", 0), ("o", 0), ("i", 2)
        rank = ins[0].rank
    else:                                  # (x, filter) -> y
        image, filt, dy = ("i", 0), ("i", 1), ("o", 0)
        rank = ins[0].rank
    n, c, spatial = _layout(op, rank)

    def shape(port):
        return (outs if port[0] == "o" else ins)[port[1]].shape

    # A grouped convolution (Keras' depthwise layers on TF) reads C / groups input channels
    # per filter: channel blocks stay within groups, like a depthwise one's.
    grouped = not depthwise and shape(filt)[2] != shape(image)[c]
    ties = [_tie(image, n, dy, n)]
    if not grouped:
        ties.append(_tie(image, c, filt, 2))
    # A depthwise output channel is c * multiplier + m: the input channel is its outer
    # factor. A full convolution's output channels are the filter's last axis.
    if depthwise or grouped:
        ties.append(_tie(image, c, dy, c))
    if not depthwise:
        ties.append(_tie(filt, 3, dy, c))
    contract = []
    if t.endswith("BackpropFilter"):
        contract += [(0, n), (2, n)]       # dfilter sums over the batch
    else:
        contract += [(1, 0), (1, 1)]       # the window is summed over
        if not (depthwise or grouped) and t.endswith("BackpropInput"):
            contract += [(1, 3), (2, c)]   # dx sums over output channels
        elif not (depthwise or grouped):
            contract += [(0, c), (1, 2)]   # y sums over input channels
    whole = [(k, a) for side, k in (image, dy) if side == "i"
             for a in spatial if ins[k].shape[a] > 1]
    return dict(ties=ties, contract=contract, whole=whole)


def _batch_norm(t, op, ins, outs):
    # Forward: (x, scale, offset, mean, variance) -> (y, batch mean, batch variance, ...);
    # gradient: (dy, x, scale, saved mean, saved variance, ...) -> (dx, dscale, doffset, ...).
    # The statistics need the batch and spatial axes whole; channels are one axis throughout.
    images = [0, 1] if "Grad" in t else [0]
    x = ins[0]
    n, c, spatial = _layout(op, x.rank)
    channels = x.shape[c]
    ties = [_tie(("i", k), a, ("o", 0), a) for k in images for a in range(x.rank)]
    ties += [_tie(("i", 0), c, ("i", k), 0) for k, v in enumerate(ins)
             if k not in images and v.shape == (channels,)]
    ties += [_tie(("i", 0), c, ("o", k), 0) for k, v in enumerate(outs)
             if k and v.shape == (channels,)]
    whole = [(k, a) for k in images for a in (n,) + spatial if ins[k].shape[a] > 1]
    return dict(ties=ties, contract=[], whole=whole)


def flops(op, ins, outs):
    """FLOPs of one op of `OPS`: 2 per multiply-add of a convolution (the window times the
    input channels, per element of the forward output, for all three convolutions); about
    one per element read for pools and ten per element for batch norms."""
    t = op.type
    if t in CONVOLUTIONS:
        depthwise = t.startswith("Depthwise")
        if t.endswith("BackpropInput"):
            dy, filt = ins[2], ins[1].shape
        elif t.endswith("BackpropFilter"):
            dy, filt = ins[2], outs[0].shape
        else:
            dy, filt = outs[0], ins[1].shape
        kh, kw, cin = filt[0], filt[1], filt[2]
        return 2.0 * dy.num_elements * kh * kw * (1 if depthwise else cin)
    if t in POOLS:
        return float(sum(x.num_elements for x in ins if x.rank == outs[0].rank))
    return 10.0 * math.prod(ins[0].shape)
