"""Cluster specs: how many devices, how fast they compute, and how fast they talk.

TF-free. A spec is a preset name (`8xH200`), an `NxGPU` / `MxNxGPU` string built from a known
device, or a dict / JSON object with the fields of `ClusterSpec`. Impossible specs raise
ValueError naming the field.
"""

import dataclasses
import json
import math
import re

# Per-device figures from vendor data sheets (dense, no sparsity). `flops` is the peak the
# planner's roofline uses for the preset's default dtype; the comment says which.
# `compute_units`: streaming multiprocessors (V100 80, A100 108, H200 SXM 132).
_DEVICES = {
    # V100 SXM2 32GB: 15.7 TFLOP/s FP32 (FP32 chosen: see tests/planner/test_planner_cost_model.py),
    # 900 GB/s HBM2, NVLink2 6 links x 25 GB/s per direction = 150 GB/s.
    "V100": dict(device_type="GPU", compute_units=80, flops=15.7e12, memory=32e9, memory_bandwidth=900e9,
                 intra_bandwidth=150e9, intra_latency=5e-6, op_overhead=5e-6),
    # A100 SXM4 80GB: 19.5 TFLOP/s FP32 (156 TF32), 2039 GB/s, NVLink3 300 GB/s per direction.
    "A100": dict(device_type="GPU", compute_units=108, flops=19.5e12, memory=80e9, memory_bandwidth=2039e9,
                 intra_bandwidth=300e9, intra_latency=5e-6, op_overhead=5e-6),
    # H200 SXM: 67 TFLOP/s FP32 (989 dense BF16), 141 GB HBM3e at 4.8 TB/s, NVLink4 450 GB/s
    # per direction.
    "H200": dict(device_type="GPU", compute_units=132, flops=67e12, memory=141e9, memory_bandwidth=4.8e12,
                 intra_bandwidth=450e9, intra_latency=5e-6, op_overhead=5e-6),
}
# Between nodes: one 200 Gb/s InfiniBand HDR NIC per GPU (V100, A100 generation) or 400 Gb/s
# NDR (H200), i.e. 25 / 50 GB/s per device, ~5 us latency.
_INTER = {"V100": (25e9, 5e-6), "A100": (25e9, 5e-6), "H200": (50e9, 5e-6)}


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster: `nodes` nodes of `devices_per_node` identical devices.

    Units: FLOP/s, bytes, bytes/s, seconds. Bandwidths are per device and per direction, as a
    ring collective sees them. `op_overhead` is the fixed cost of launching one op.
    `compute_units` (streaming multiprocessors of a GPU; 0 for none) is how many output tiles
    of a matrix product run at once: the cost model prices products in whole waves of tiles.
    `send_bandwidth`, `send_latency`: a pipeline's point-to-point send between two devices
    of a node, where it differs from a collective's link (logical CPUs of one process hand
    a tensor over in memory); 0 for the intra-node link.
    `shared_cores`: the devices are logical devices of one machine that share its cores (a
    process's logical CPUs, localhost workers): one device alone computes at `flops` and
    `memory_bandwidth`, all of them together no faster, so a step takes at least all
    devices' work end to end.
    """
    name: str
    devices_per_node: int
    nodes: int
    flops: float
    memory: float
    memory_bandwidth: float
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    device_type: str = "GPU"
    op_overhead: float = 0.0
    compute_units: int = 0
    shared_cores: bool = False
    send_bandwidth: float = 0.0
    send_latency: float = 0.0

    def __post_init__(self):
        for field in ("devices_per_node", "nodes"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"cluster spec field {field!r} must be a positive integer, "
                                 f"got {value!r}")
        units = self.compute_units
        if not isinstance(units, int) or isinstance(units, bool) or units < 0:
            raise ValueError("cluster spec field 'compute_units' must be an integer >= 0 "
                             f"(0: no wave quantization), got {units!r}")
        for field in ("flops", "memory", "memory_bandwidth", "intra_bandwidth"):
            value = getattr(self, field)
            if not _is_number(value) or not value > 0 or math.isinf(value):
                raise ValueError(f"cluster spec field {field!r} must be a positive finite "
                                 f"number, got {value!r}")
        if self.nodes > 1:
            if not _is_number(self.inter_bandwidth) or not self.inter_bandwidth > 0:
                raise ValueError("cluster spec field 'inter_bandwidth' must be positive when "
                                 f"nodes > 1, got {self.inter_bandwidth!r}")
        for field in ("intra_latency", "inter_latency", "op_overhead", "inter_bandwidth",
                      "send_bandwidth", "send_latency"):
            value = getattr(self, field)
            if not _is_number(value) or value < 0 or math.isinf(value):
                raise ValueError(f"cluster spec field {field!r} must be a finite number >= 0, "
                                 f"got {value!r}")
        if not isinstance(self.shared_cores, bool):
            raise ValueError("cluster spec field 'shared_cores' must be true or false, got "
                             f"{self.shared_cores!r}")
        if self.device_type not in ("GPU", "CPU"):
            raise ValueError(f"cluster spec field 'device_type' must be 'GPU' or 'CPU', got "
                             f"{self.device_type!r}")

    @property
    def num_devices(self):
        return self.devices_per_node * self.nodes

    def link(self, group_size, stride):
        """(bandwidth, latency) of a ring over `group_size` devices `stride` apart.

        Devices are numbered node-major. A ring that leaves a node runs at the inter-node
        link's speed: the slowest hop sets a ring's pace.
        """
        if group_size <= 1:
            return self.intra_bandwidth, self.intra_latency
        span = (group_size - 1) * stride + 1
        if span <= self.devices_per_node:
            return self.intra_bandwidth, self.intra_latency
        return self.inter_bandwidth, self.inter_latency

    def send_link(self, stride):
        """(bandwidth, latency) of a pipeline send between devices `stride` apart: the
        send figures within a node where they are given, else the ring's link."""
        if self.send_bandwidth > 0 and stride < self.devices_per_node:
            return self.send_bandwidth, self.send_latency
        return self.link(2, stride)

    def device_name(self, index):
        """The TensorFlow device string of global device `index` (node-major)."""
        if not 0 <= index < self.num_devices:
            raise ValueError(f"device index {index} out of range for {self.num_devices} devices")
        node, local = divmod(index, self.devices_per_node)
        if self.name == "cpu-localhost" or (self.nodes == 1 and self.device_type == "CPU"):
            return f"/job:localhost/replica:0/task:0/device:{self.device_type}:{local}"
        return f"/job:worker/replica:0/task:{node}/device:{self.device_type}:{local}"

    def to_dict(self):
        return dataclasses.asdict(self)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _from_device(device, per_node, nodes):
    if device not in _DEVICES:
        raise ValueError(f"unknown device {device!r} in cluster spec; known: "
                         f"{', '.join(sorted(_DEVICES))}")
    inter_bw, inter_lat = _INTER[device]
    name = f"{per_node}x{device}" if nodes == 1 else f"{nodes}x{per_node}x{device}"
    return ClusterSpec(name=name, devices_per_node=per_node, nodes=nodes,
                       inter_bandwidth=inter_bw, inter_latency=inter_lat, **_DEVICES[device])


def cpu_cluster(devices=4, name="cpu-localhost", nodes=1):
    """CPU devices on this machine: `nodes` processes of `devices` logical devices each.

    Within a process they share one socket's cores and memory, so "communication" is a
    memcpy. Between processes (localhost gRPC workers) it is an assumed 1 GB/s, 50 us
    loopback, not a measurement. Modest figures for a 2-core VM; this machine's measured
    ones are `cpu_calibration.measured_cluster(n)`'s, and a `local_cluster`'s spec has
    the loopback measured (`loopback_calibration`). The devices share the machine's cores
    (`shared_cores`).
    """
    return ClusterSpec(name=name, devices_per_node=devices, nodes=nodes, flops=5e10,
                       memory=8e9, memory_bandwidth=10e9, intra_bandwidth=5e9,
                       intra_latency=2e-6, inter_bandwidth=1e9 if nodes > 1 else 0.0,
                       inter_latency=50e-6 if nodes > 1 else 0.0,
                       device_type="CPU", op_overhead=5e-6, shared_cores=True)


PRESETS = ("8xV100", "8xA100", "8xH200", "2x8xH200", "4x8xH200", "cpu-localhost")

_FIELDS = {f.name for f in dataclasses.fields(ClusterSpec)}


def get_cluster(spec):
    """Returns a `ClusterSpec` from a spec, a preset name or string, a dict or a JSON string.

    Strings: `cpu-localhost`, `NxDEV` (N devices of DEV in one node) or `MxNxDEV` (M nodes),
    DEV one of V100, A100, H200, or `NxCPU`: N logical CPU devices of this process, with
    `cpu-localhost`'s figures. A dict (or JSON object) either names `"base"` (a string spec)
    and overrides fields, or gives every field of ClusterSpec.
    """
    if isinstance(spec, ClusterSpec):
        return spec
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                return get_cluster(json.loads(text))
            except json.JSONDecodeError as e:
                raise ValueError(f"cluster spec is not valid JSON: {e}") from None
        if text == "cpu-localhost":
            return cpu_cluster()
        match = re.fullmatch(r"(?:(\d+)x)?(\d+)x([A-Za-z0-9]+)", text)
        if not match:
            raise ValueError(f"cannot parse cluster spec {spec!r}: expected a preset "
                             f"({', '.join(PRESETS)}), 'NxDEVICE' or 'MxNxDEVICE'")
        nodes = int(match.group(1) or 1)
        per_node = int(match.group(2))
        if nodes < 1:
            raise ValueError(f"cluster spec field 'nodes' must be >= 1 in {spec!r}")
        if per_node < 1:
            raise ValueError(f"cluster spec field 'devices_per_node' must be >= 1 in {spec!r}")
        device = match.group(3).upper()
        if device == "CPU":
            if match.group(1):
                raise ValueError(f"cluster spec {spec!r}: CPU devices are logical devices of "
                                 "one process, so only 'NxCPU' (one node) is known")
            return cpu_cluster(per_node, name=f"{per_node}xCPU")
        return _from_device(device, per_node, nodes)
    if isinstance(spec, dict):
        unknown = set(spec) - _FIELDS - {"base"}
        if unknown:
            raise ValueError(f"unknown cluster spec field(s) {sorted(unknown)}; known: "
                             f"{sorted(_FIELDS)}")
        if "base" in spec:
            base = get_cluster(spec["base"]).to_dict()
            overrides = {k: v for k, v in spec.items() if k != "base"}
            base.update(overrides)
            if overrides and "name" not in overrides:
                base["name"] = f"{spec['base']}(custom)"
            return ClusterSpec(**base)
        missing = _FIELDS - set(spec) - {"device_type", "op_overhead", "compute_units",
                                         "shared_cores", "send_bandwidth", "send_latency"}
        if missing:
            raise ValueError(f"cluster spec is missing field(s) {sorted(missing)} (or give "
                             f"'base': a preset to override)")
        return ClusterSpec(**spec)
    raise ValueError(f"cluster spec must be a ClusterSpec, str or dict, got "
                     f"{type(spec).__name__}")
