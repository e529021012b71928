"""The GPU side of the fusion compiler, TF-free like the rest of the core.

  mapping    how a CUDA block runs a schedule's rows (thread, warp or block
             per row; split rows), by column-count thresholds
  cost       the latency evaluator: a plan's predicted time on a GPU spec
  occupancy  resident blocks per SM from threads, registers, shared memory
  choice     the plan the evaluator predicts fastest (plan_gpu)
  build      CUDA source, cubins through NVRTC, the CPU emulation, loading

The CUDA printer itself is codegen/gpu_printer.py, beside the C++ one.
"""
