"""Cost model: roofline compute, alpha-beta collectives, memory per device, pipeline schedule.

TF-free. The formulas are module functions (each unit-tested against hand-computed values);
`CostModel` applies them to a graph, a cluster and a `Config` (mesh, split units, pipeline
cuts, micro-batches) and returns an `Estimate`.

Conventions: a ring collective over n devices of a tensor of N bytes, per device:
  all-reduce      2(n-1) alpha + 2(n-1)/n N / beta     (sends 2(n-1)/n N)
  all-gather      (n-1) alpha  + (n-1)/n N / beta      (N = gathered size; sends (n-1)/n N)
  reduce-scatter  (n-1) alpha  + (n-1)/n N / beta      (N = input size)
  point-to-point  alpha + N / beta
Nothing overlaps: compute and communication add up (a pessimistic, explainable choice).
"""

import dataclasses
import itertools
import math

from tf_fusionstitch.planner import fused_pricing, ir, op_rules

# -- the formulas -----------------------------------------------------------------------------


def roofline_time(flops, nbytes, peak_flops, memory_bandwidth, overhead=0.0):
    """Time of one op: bound by arithmetic or by memory traffic, plus a launch overhead."""
    if flops <= 0 and nbytes <= 0:
        return 0.0
    return max(flops / peak_flops, nbytes / memory_bandwidth) + overhead


# Output tile of one thread block of a large matrix product: cuBLAS's large-problem FP32
# and FP16 kernels use 128 x 128 (or larger) tiles.
GEMM_TILE = 128 * 128
_GEMMS = frozenset("Einsum Conv2D Conv2DBackpropInput Conv2DBackpropFilter".split())


def wave_efficiency(output_elements, compute_units, tile=GEMM_TILE):
    """Fraction of a GPU's peak a matrix product of this output size can use.

    A product with at least one full wave of large tiles runs them in waves of
    `compute_units` at once, and its last wave runs part full (wave quantization, NVIDIA's
    "Matrix Multiplication Background" guide): 256 tiles on 80 units take 4 waves, the time
    of 320 tiles, so 80%. A smaller product is tiled finer (or split along its contraction)
    to fill the device and is priced at peak: its time is launch and memory bound anyway.
    0 units: no quantization (CPUs, custom specs).
    """
    if compute_units <= 0 or output_elements <= 0:
        return 1.0
    tiles = math.ceil(output_elements / tile)
    if tiles < compute_units:
        return 1.0
    return tiles / (math.ceil(tiles / compute_units) * compute_units)


def all_reduce_time(nbytes, n, bandwidth, latency):
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth


def all_gather_time(nbytes, n, bandwidth, latency):
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * latency + (n - 1) / n * nbytes / bandwidth


def reduce_scatter_time(nbytes, n, bandwidth, latency):
    return all_gather_time(nbytes, n, bandwidth, latency)


def p2p_time(nbytes, bandwidth, latency):
    if nbytes <= 0:
        return 0.0
    return latency + nbytes / bandwidth


COLLECTIVE_TIME = {"all_reduce": all_reduce_time, "all_gather": all_gather_time,
                   "reduce_scatter": reduce_scatter_time}


def traffic(kind, nbytes, n):
    """Bytes one device sends in a ring collective over n devices on an N-byte tensor."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * nbytes
    if kind == "p2p":
        return float(nbytes)
    raise ValueError(f"unknown collective {kind!r}")


def pipeline_time(stage_times, micro_batches):
    """Step time of a synchronous pipeline (GPipe and 1F1B alike): (m + p - 1) * slowest stage.

    stage_times: per micro-batch forward+backward time of each stage.
    """
    if not stage_times:
        return 0.0
    return (micro_batches + len(stage_times) - 1) * max(stage_times)


def bubble_fraction(stages, micro_batches):
    return (stages - 1) / (micro_batches + stages - 1)


def in_flight_micro_batches(stage, stages, micro_batches, schedule):
    """Micro-batches whose activations stage `stage` holds at its peak.

    GPipe runs all m forwards before any backward; 1F1B starts backwards after p - stage
    warm-up forwards, so early stages hold more.
    """
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(stages - stage, micro_batches)
    raise ValueError(f"unknown pipeline schedule {schedule!r}; use 'gpipe' or '1f1b'")


def memory_per_device(weights, gradients, activations_per_micro_batch, in_flight):
    """Bytes: weights and optimizer state (variables), gradients, live activations."""
    return weights + gradients + activations_per_micro_batch * in_flight


# -- applying them to a graph -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """One point of the strategy space.

    replicas (d) x tensor_parallel (t) x stages (p) devices. split_units: indices of linkage
    units split t ways. cuts: p-1 increasing pipeline-unit boundaries.
    """
    replicas: int = 1
    tensor_parallel: int = 1
    stages: int = 1
    micro_batches: int = 1
    split_units: frozenset = frozenset()
    cuts: tuple = ()
    schedule: str = "1f1b"

    @property
    def devices(self):
        return self.replicas * self.tensor_parallel * self.stages


@dataclasses.dataclass
class Collective:
    kind: str
    op: str
    tensor: str
    nbytes: float       # the N of the formulas, per micro-batch for activations
    phase: str
    group: int          # devices taking part
    stage: int = 0


@dataclasses.dataclass
class Estimate:
    step_time: float
    feasible: bool
    peak_memory: float                # bytes, the fullest device
    memory_per_stage: list
    stage_times: list                 # per micro-batch
    update_times: list
    dp_times: list
    collectives: list                 # tensor-parallel, per micro-batch
    p2p_bytes: list
    reason: str = ""

    def tp_traffic(self, phase=None, elements=False):
        """Bytes (or elements of 4 bytes) one device sends in tensor-parallel collectives."""
        total = sum(traffic(c.kind, c.nbytes, c.group) for c in self.collectives
                    if phase is None or c.phase == phase)
        return total / 4 if elements else total

    def count(self, kind, phase=None):
        return sum(1 for c in self.collectives if c.kind == kind and
                   (phase is None or c.phase == phase))


class TensorParallelAnalysis:
    """Shardings propagated through the graph for one set of split groups and degree t.

    A tensor is split on the axis that lies in a split group, or replicated; it may also be
    a partial sum (after a contraction over a split axis). Each mismatch becomes the
    collective it needs: a split axis an op needs whole -> all-gather; a partial sum read by
    an op that is not linear in it -> all-reduce (reduce-scatter if the tensor stays split).
    Partial sums flow unreduced through views and additions, so a gradient summed from
    several column-split matmuls is reduced once.
    """

    def __init__(self, graph, split_groups, t):
        self.degree = t
        self.divisor = {}
        self.collectives = []
        link = graph.linkage
        tensors = graph.tensors
        split_axis, partial, reduced, gathered_t = {}, {}, set(), set()
        reducer = {}   # partial tensor -> the op that reduces it for all its readers

        def axis_of(name):
            if name in split_axis:
                return split_axis[name]
            axis = None
            for a, g in enumerate(link.groups_of_tensor(name)):
                if g is not None and g in split_groups:
                    axis = a
                    break
            split_axis[name] = axis
            return axis

        def collect(kind, op, name, nbytes):
            self.collectives.append(Collective(kind, op.name, name, nbytes, op.phase, t))

        for op in graph.ops.values():
            rule = link.rules[op.name]
            gathered = set()
            if t > 1 and split_groups:
                for k, a in rule.whole:
                    name = op.inputs[k]
                    g = link.group_of.get((name, a))
                    if g in split_groups and axis_of(name) == a:
                        gathered.add(g)
                        if name not in gathered_t:
                            gathered_t.add(name)
                            collect("all_gather", op, name, tensors[name].nbytes)
                for n in op.inputs:
                    if reducer.get(n) == op.name and n not in reduced:
                        reduced.add(n)
                        kind = "reduce_scatter" if axis_of(n) is not None else "all_reduce"
                        collect(kind, op, n, tensors[n].nbytes)
                # A partial sum some reader must reduce is reduced once for all its readers,
                # so only views and additions, each reading it before that, see it partial.
                p_in = [partial.get(n, False) and n not in reducer for n in op.inputs]
                out_partial = False
                if any(p_in):
                    if rule.pass_partial:
                        out_partial = True
                    elif all(p for p, n in zip(p_in, op.inputs)
                             if tensors[n].num_elements > 1):
                        out_partial = True
                    else:
                        # Sum the partial inputs locally, reduce once, then add the rest.
                        out = op.outputs[0]
                        kind = "reduce_scatter" if axis_of(out) is not None else "all_reduce"
                        collect(kind, op, out, tensors[out].nbytes)
                for k, a in rule.contract:
                    g = link.group_of.get((op.inputs[k], a))
                    if g in split_groups and g not in gathered:
                        out_partial = True
                for n in op.outputs:
                    partial[n] = out_partial
                    if out_partial:
                        # The first reader not linear in it reduces it (ops are in order).
                        first = next((c for c in tensors[n].consumers
                                      if not (link.rules[c].pass_partial or
                                              link.rules[c].additive)), None)
                        if first is not None:
                            reducer[n] = first
            present = set()
            for n in list(op.inputs) + list(op.outputs):
                for g in link.groups_of_tensor(n):
                    if g is not None and g in split_groups:
                        present.add(g)
            self.divisor[op.name] = t if present - gathered else 1
        for n in graph.outputs:
            if partial.get(n) and n not in reduced:
                op = graph.ops[tensors[n].producer]
                collect("all_reduce", op, n, tensors[n].nbytes)
        self.split_axis = {n: axis_of(n) for n in tensors}


class CostModel:
    """Estimates step time and memory of a `Config` on one graph and cluster.

    Counts its calls to `evaluate` (searches report them), and caches tensor-parallel
    analyses, which depend only on the split units and the degree.

    fusion: how memory-intensive ops are priced (`fused_pricing.RULES`): "none", each op
    its own kernel as TF's executor runs it; "stitch", clusters as tf_fusionstitch fuses
    them; "xla", clusters as XLA fuses them on GPUs.
    """

    MAX_PIPELINE_UNITS = 32

    def __init__(self, graph, cluster, fusion="none"):
        if fusion not in fused_pricing.RULES:
            raise ValueError(f"unknown fusion {fusion!r}; use one of "
                             f"{', '.join(fused_pricing.RULES)}")
        self.graph = graph
        self.cluster = cluster
        self.fusion = fusion
        self.calls = 0
        self._tp_cache = {}
        link = graph.linkage
        tensors = graph.tensors
        self.batch = graph.batch_size
        self.has_batch = {}
        for name in tensors:
            self.has_batch[name] = any(g in link.batch_groups for g in link.groups_of_tensor(name)
                                       if g is not None)
        self.op_has_batch = {op.name: any(self.has_batch[n] for n in op.inputs + op.outputs)
                             for op in graph.ops.values()}
        self.forward = [op for op in graph.ops.values() if op.phase == ir.FORWARD]
        self.training = any(op.phase != ir.FORWARD for op in graph.ops.values())
        # Saved activations: forward results a backward op reads (views do not own memory).
        self.saved = [n for op in self.forward if not op_rules.is_free(op.type)
                      or op.type == "Placeholder" for n in op.outputs
                      if not tensors[n].variable and
                      any(graph.ops[c].phase != ir.FORWARD for c in tensors[n].consumers)]
        self._build_pipeline_units()
        self._fused = {}   # pipeline cuts -> fused costs (kernels do not span stages)
        # Matrix products and convolutions (implicit GEMMs): the output their tiles cover,
        # its elements and whether the batch splits it.
        self.gemm_output = {op.name: (op.outputs[0], tensors[op.outputs[0]].num_elements,
                                      self.has_batch[op.outputs[0]])
                            for op in graph.ops.values()
                            if op.outputs and (op_rules.is_matmul(op.type) or
                                               op.type in _GEMMS)}

    def fused_costs(self, cuts=()):
        """{op name: fused_pricing.FusedCost} under pipeline `cuts` ({} without fusion)."""
        if self.fusion == "none":
            return {}
        if cuts not in self._fused:
            stage = self.stage_of_unit(cuts)
            # The forward pass fuses apart from the rest; an optimizer's arithmetic fuses
            # with the variable writes it feeds (one kernel per update, as XLA runs it).
            self._fused[cuts] = fused_pricing.fused_costs(
                self.graph, {name: (op.phase == ir.FORWARD, stage[self.anchor[name]])
                             for name, op in self.graph.ops.items()}, self.fusion)
        return self._fused[cuts]

    def op_time(self, op, k, tp, fused):
        """Time of one op on one device: its batch split `k` ways (replicas x micro-batches),
        its share under tensor parallelism `tp`, its cluster's share under `fused`
        (`fused_costs`); a matrix product's in waves of tiles."""
        c = self.cluster
        div = tp.divisor[op.name] * (k if self.op_has_batch[op.name] else 1)
        flops = op.flops / div
        gemm = self.gemm_output.get(op.name)
        if gemm is not None and c.compute_units:
            out, elements, batched = gemm
            per_device = elements / (k if batched else 1) / (
                tp.degree if tp.split_axis.get(out) is not None else 1)
            flops /= wave_efficiency(per_device, c.compute_units)
        fused = fused.get(op.name)
        if fused is None:
            return roofline_time(flops, op.bytes / div, c.flops, c.memory_bandwidth,
                                 0.0 if op_rules.is_free(op.type) else c.op_overhead)
        return roofline_time(flops, fused.bytes / div, c.flops,
                             c.memory_bandwidth) + (c.op_overhead if fused.launches else 0.0)

    # -- pipeline units and anchors --------------------------------------------------------

    def _build_pipeline_units(self):
        graph, c = self.graph, self.cluster
        cost = [roofline_time(op.flops, op.bytes, c.flops, c.memory_bandwidth) for op in
                self.forward]
        total = sum(cost) or 1.0
        n_units = max(1, min(self.MAX_PIPELINE_UNITS,
                             sum(1 for x in cost if x > 0)))
        self.unit_of = {}
        unit, acc = 0, 0.0
        for op, x in zip(self.forward, cost):
            # Close a unit once it holds its share of the forward time.
            if acc >= total * (unit + 1) / n_units and unit < n_units - 1 and x > 0:
                unit += 1
            self.unit_of[op.name] = unit
            acc += x
        self.num_units = unit + 1
        # Free ops (variable reads, views, placeholders) go with their first forward user,
        # so a cut before a layer also moves the reads of its weights.
        for op in reversed(self.forward):
            if op_rules.is_free(op.type):
                users = [self.unit_of[c] for n in op.outputs
                         for c in graph.tensors[n].consumers if c in self.unit_of]
                if users:
                    self.unit_of[op.name] = min(users)
        tensors = graph.tensors
        var_unit = {}
        for name, t in tensors.items():
            if t.variable:
                for op in t.consumers:
                    if graph.ops[op].phase == ir.FORWARD:
                        u = self.unit_of[op]
                        var_unit[t.variable] = min(u, var_unit.get(t.variable, u))
        # Where each backward and update op runs. A gradient op runs with the forward op it
        # mirrors, which TF's gradient name scopes tell (`gradient_tape/<forward op>/...`);
        # an update runs where its variable lives; anything else (gradient sums, optimizer
        # arithmetic) with its earliest input, since gradients flow from later stages back.
        self.anchor = dict(self.unit_of)
        for op in graph.ops.values():
            if op.phase == ir.FORWARD:
                continue
            owned = [var_unit[tensors[n].variable] for n in op.inputs
                     if tensors[n].variable in var_unit]
            mirrored = self._mirrored_forward_op(op.name)
            if op.phase == ir.UPDATE and owned:
                self.anchor[op.name] = min(owned)
                continue
            if mirrored is not None:
                self.anchor[op.name] = self.unit_of[mirrored]
                continue
            found = list(owned)
            for name in op.inputs:
                t = tensors[name]
                if not t.variable and t.producer in self.anchor and \
                        graph.ops[t.producer].type != "Const":
                    found.append(self.anchor[t.producer])
            self.anchor[op.name] = min(found) if found else self.num_units - 1
        for op in graph.ops.values():
            for name in op.inputs:
                var = tensors[name].variable
                if var and var not in var_unit:
                    var_unit[var] = self.anchor[op.name]
        # Input-less helpers of the backward pass and the update (handle placeholders, the
        # optimizer's scalar constants) go with what reads them.
        for op in graph.ops.values():
            if op.phase != ir.FORWARD and not op.inputs:
                handles = [tensors[n].variable for n in op.outputs if tensors[n].variable]
                readers = [self.anchor[c] for n in op.outputs for c in tensors[n].consumers]
                if handles and handles[0] in var_unit:
                    self.anchor[op.name] = var_unit[handles[0]]
                elif readers:
                    self.anchor[op.name] = min(readers)
        self.var_unit = var_unit

    def _mirrored_forward_op(self, name):
        """The forward op a gradient op's name scope names, if any."""
        for prefix in ("gradient_tape/", "gradients/"):
            if name.startswith(prefix):
                parts = name[len(prefix):].split("/")
                for k in range(len(parts) - 1, 0, -1):
                    candidate = "/".join(parts[:k])
                    if prefix == "gradients/" and candidate.endswith("_grad"):
                        candidate = candidate[:-len("_grad")]
                    if candidate in self.unit_of:
                        return candidate
        return None

    def stage_of_unit(self, cuts):
        stages, s = [], 0
        for u in range(self.num_units):
            while s < len(cuts) and u >= cuts[s]:
                s += 1
            stages.append(s)
        return stages

    # -- evaluation ----------------------------------------------------------------------------

    def tensor_parallel(self, split_units, t):
        key = (frozenset(split_units), t)
        if key not in self._tp_cache:
            groups = self.graph.linkage.split_groups(split_units) if t > 1 else frozenset()
            self._tp_cache[key] = TensorParallelAnalysis(self.graph, groups, t)
        return self._tp_cache[key]

    def evaluate(self, config):
        """The `Estimate` of `config`. Raises ValueError for a config that cannot exist."""
        self.calls += 1
        graph, c = self.graph, self.cluster
        d, t, p, m = (config.replicas, config.tensor_parallel, config.stages,
                      config.micro_batches)
        if config.devices != c.num_devices:
            raise ValueError(f"config uses {config.devices} devices, cluster has "
                             f"{c.num_devices}")
        if len(config.cuts) != p - 1 or list(config.cuts) != sorted(set(config.cuts)) or \
                any(not 0 < x < self.num_units for x in config.cuts):
            raise ValueError(f"cuts {config.cuts} are not {p - 1} increasing unit boundaries "
                             f"in 1..{self.num_units - 1}")
        if self.batch % (d * m):
            raise ValueError(f"batch {self.batch} does not divide into {d} replicas x {m} "
                             "micro-batches")
        tp = self.tensor_parallel(config.split_units, t)
        k = d * m
        tensors = graph.tensors
        unit_stage = self.stage_of_unit(config.cuts)
        stage = {op: unit_stage[u] for op, u in self.anchor.items()}
        tp_bw, tp_lat = c.link(t, 1)
        dp_bw, dp_lat = c.link(d, t)
        pp_bw, pp_lat = c.send_link(t * d)
        compute = [0.0] * p
        update = [0.0] * p
        fused = self.fused_costs(tuple(config.cuts))
        for op in graph.ops.values():
            x = self.op_time(op, k, tp, fused)
            (update if op.phase == ir.UPDATE else compute)[stage[op.name]] += x
        op_work = m * sum(compute) + sum(update)   # one device per stage, before any transfer
        collectives = []
        for col in tp.collectives:
            scaled = col.nbytes / (k if self.has_batch[col.tensor] else 1)
            s = stage[col.op]
            collectives.append(dataclasses.replace(col, nbytes=scaled, stage=s))
            x = COLLECTIVE_TIME[col.kind](scaled, t, tp_bw, tp_lat)
            (update if col.phase == ir.UPDATE else compute)[s] += x
        # Pipeline sends: each tensor once to each later (or, backward, earlier) stage.
        p2p = [0.0] * p
        if p > 1:
            for name, ten in tensors.items():
                prod = ten.producer
                if not prod or ten.variable or graph.ops[prod].type in ("Const", "Placeholder"):
                    continue
                dests = {stage[cons] for cons in ten.consumers} - {stage[prod]}
                nbytes = ten.nbytes / (k if self.has_batch[name] else 1)
                if tp.split_axis.get(name) is not None:
                    nbytes /= t
                for _ in dests:
                    p2p[stage[prod]] += nbytes
                    compute[stage[prod]] += p2p_time(nbytes, pp_bw, pp_lat)
        # Weights, gradients, data-parallel gradient all-reduce per stage.
        split_vars = {v for v, _ in (va for u in config.split_units
                                     for va in graph.linkage.units[u].variables)} if t > 1 \
            else set()
        weights, grads = [0.0] * p, [0.0] * p
        for var in graph.variables.values():
            s = unit_stage[self.var_unit.get(var.name, 0)]
            size = var.nbytes / (t if var.name in split_vars else 1)
            weights[s] += size
            if var.trainable and self.training:
                grads[s] += size
        dp = [all_reduce_time(g, d, dp_bw, dp_lat) for g in grads]
        # Activations per micro-batch and device.
        acts = [0.0] * p
        if self.training:
            for name in self.saved:
                nbytes = tensors[name].nbytes / (k if self.has_batch[name] else 1)
                if tp.split_axis.get(name) is not None:
                    nbytes /= t
                acts[stage[tensors[name].producer]] += nbytes
        else:
            for op in graph.ops.values():
                live = sum(tensors[n].nbytes / (k if self.has_batch[n] else 1)
                           for n in op.inputs + op.outputs if not tensors[n].variable)
                acts[stage[op.name]] = max(acts[stage[op.name]], live / tp.divisor[op.name])
        memory = [memory_per_device(weights[s], grads[s], acts[s],
                                    in_flight_micro_batches(s, p, m, config.schedule)
                                    if self.training else 1) for s in range(p)]
        step = pipeline_time(compute, m) + max(update) + max(dp)
        if c.shared_cores:
            # Devices sharing one machine's cores compute no faster together than one alone,
            # and an idle one's cores work for the others (no pipeline bubble): the step
            # takes every device's op work (d x t devices per stage) end to end, and each
            # transfer once.
            transfers = m * sum(compute) + sum(update) - op_work
            step = d * t * op_work + transfers + max(dp)
        peak = max(memory)
        feasible = peak <= c.memory
        reason = "" if feasible else (
            f"needs {peak / 1e9:.1f} GB on the fullest device, which has "
            f"{c.memory / 1e9:.1f} GB")
        return Estimate(step, feasible, peak, memory, compute, update, dp, collectives, p2p,
                        reason)

    def unit_profile(self, split_units, t, k):
        """Per pipeline unit, for dynamic programming over cuts.

        Returns (compute per micro-batch incl. tensor-parallel collectives, weight + gradient
        bytes, saved-activation bytes per micro-batch, bytes crossing each unit boundary per
        micro-batch, indexed by the boundary's position 0..n).
        """
        graph, c = self.graph, self.cluster
        tensors = graph.tensors
        n = self.num_units
        tp = self.tensor_parallel(split_units, t)
        tp_bw, tp_lat = c.link(t, 1)
        comp, mem, acts = [0.0] * n, [0.0] * n, [0.0] * n
        # Clusters as without cuts: a cut through one prices it fused (the plan's own
        # `evaluate` then prices it split).
        fused = self.fused_costs()
        for op in graph.ops.values():
            if op.phase == ir.UPDATE:
                continue
            comp[self.anchor[op.name]] += self.op_time(op, k, tp, fused)
        for col in tp.collectives:
            scaled = col.nbytes / (k if self.has_batch[col.tensor] else 1)
            comp[self.anchor[col.op]] += COLLECTIVE_TIME[col.kind](scaled, t, tp_bw, tp_lat)
        split_vars = {v for u in split_units for v, _ in graph.linkage.units[u].variables} \
            if t > 1 else set()
        for var in graph.variables.values():
            size = var.nbytes / (t if var.name in split_vars else 1)
            mem[self.var_unit.get(var.name, 0)] += size * (2 if var.trainable and
                                                           self.training else 1)
        if self.training:
            for name in self.saved:
                nbytes = tensors[name].nbytes / (k if self.has_batch[name] else 1)
                acts[self.anchor[tensors[name].producer]] += nbytes / (
                    t if tp.split_axis.get(name) is not None else 1)
        diff = [0.0] * (n + 2)
        for name, ten in tensors.items():
            prod = ten.producer
            if not prod or ten.variable or graph.ops[prod].type in ("Const", "Placeholder"):
                continue
            units = [self.anchor[cons] for cons in ten.consumers]
            if not units:
                continue
            nbytes = ten.nbytes / (k if self.has_batch[name] else 1)
            if tp.split_axis.get(name) is not None:
                nbytes /= t
            pu = self.anchor[prod]
            lo, hi = min(units + [pu]), max(units + [pu])
            if hi > lo:   # crosses every boundary strictly between lo and hi
                diff[lo + 1] += nbytes
                diff[hi + 1] -= nbytes
        boundary = list(itertools.accumulate(diff))[:n + 1]
        return comp, mem, acts, boundary
