// The FusionStitch TensorFlow op: runs one generated, stitched CPU kernel.
//
// A FusionStitch node stands for a fused cluster of memory-intensive ops. Its
// kernel is generated from the node's `spec` (the fusion IR as JSON) and
// compiled into a shared object, alone or with others (a library), exporting
// the ABI in docs/KERNEL_ABI.md: fs_meta, fs_shape, fs_run, each suffixed
// with the kernel's symbol in a library.
// The graph never carries code: Python (tf_fusionstitch.optimize) validates the
// spec, generates and compiles the kernel, and registers it in this process
// under `kernel_key` with fs_register_kernel(). A graph that arrives from
// elsewhere (a SavedModel) names keys this process has not registered: the
// resolver Python installs (fs_set_resolver) checks each such node's spec when
// the node enters a graph (the shape function: a spec refused there fails the
// graph's construction, naming the node) and builds and registers the kernels
// when the first of them runs. The op refuses to run when the key is unknown
// and cannot be resolved, or the node's spec differs from the one registered.
//
// The op is stateless: outputs depend only on inputs and attributes, so
// TensorFlow may deduplicate, reorder or constant-fold it like any pure op.
//
// Per call: input extents -> fs_shape (output extents, run-time extents, work
// item count and cost) -> outputs allocated (reusing an input buffer where the
// kernel allows it and TensorFlow agrees) -> fs_run over [0, work) sharded on
// TensorFlow's intra-op thread pool. No Python runs per call.
//
// On a GPU (compiled with GOOGLE_CUDA, in a CUDA build of TensorFlow) the same
// call is prepared by the same code (PrepareCall: shapes, checks, outputs) and
// then launches the cluster's CUDA kernel (docs/KERNEL_ABI.md, "CUDA
// kernels") on TensorFlow's stream: a cubin registered under the kernel's key
// (fs_register_cuda_kernel) beside its host part, which is the registered
// kernel of target "cuda-emulated" (its fs_meta and fs_shape are the CUDA
// kernel's; its fs_run emulates it on the CPU). The grid and the kernel's
// arguments come from Launches and KernelArgs, TF- and CUDA-free code that
// every build compiles (fs_launches exports the first for tests).

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

#if GOOGLE_CUDA
#include <cuda.h>

#include "xla/stream_executor/stream.h"
#endif  // GOOGLE_CUDA

namespace tensorflow {
namespace fusion_stitch {

constexpr int64_t kAbiVersion = 2;
constexpr int64_t kMaxCount = int64_t{1} << 16;  // sanity bound for fs_meta counts
constexpr int64_t kMaxRank = 254;                // TensorShape's limit
constexpr int64_t kErrLen = 1024;

using ShapeFn = int (*)(const int64_t* in_dims, int64_t* out_dims, int64_t* ext,
                        int64_t* work, char* err, int64_t errlen);
using RunFn = void (*)(int64_t begin, int64_t end, const int64_t* ext,
                       void* const* bufs);
// Optional: validates the inputs' values (a segment sum's ids) before fs_run.
using CheckFn = int (*)(const int64_t* ext, void* const* in_bufs, char* err,
                        int64_t errlen);
// Python's resolver (custom_ops/loader.py) for keys not registered here.
// stage kCheckSpec: the spec is validated and its key must be its hash;
// stage kBuildKernels: that kernel, and every other checked one, is built and
// registered. Returns 0, or non-zero with the reason in err.
using ResolveFn = int (*)(int stage, const char* key, const char* spec, char* err,
                          int64_t errlen);
constexpr int kCheckSpec = 0;
constexpr int kBuildKernels = 1;

// A registered kernel, with fs_meta decoded once. Never unloaded: op kernels
// hold pointers into it for the life of the process.
struct LoadedKernel {
  std::string spec;
  std::string so_path;
  std::string symbol;        // suffix of its ABI symbols ("" alone in so_path)
  ShapeFn shape = nullptr;
  RunFn run = nullptr;
  CheckFn check = nullptr;   // absent in most kernels
  int n_in = 0;
  int n_out = 0;
  int n_ext = 0;
  std::vector<int> in_ranks;
  std::vector<int> out_ranks;
  std::vector<DataType> in_dtypes;   // the dtypes the kernel was generated for
  std::vector<DataType> out_dtypes;
  std::vector<std::vector<int>> forward_candidates;  // per output: input indices
};

std::mutex registry_mu;
std::unordered_map<std::string, std::shared_ptr<const LoadedKernel>>& Registry() {
  static auto* registry =
      new std::unordered_map<std::string, std::shared_ptr<const LoadedKernel>>();
  return *registry;
}

thread_local std::string last_error;

std::atomic<ResolveFn> resolver{nullptr};
// Specs the resolver accepted, by key: shape inference runs again and again
// (every function instantiation), and Python is asked once per key.
std::unordered_map<std::string, std::string>& Checked() {
  static auto* checked = new std::unordered_map<std::string, std::string>();
  return *checked;
}

int Fail(const std::string& message) {
  last_error = message;
  return 1;
}

std::shared_ptr<const LoadedKernel> Lookup(const std::string& key) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = Registry().find(key);
  return it == Registry().end() ? nullptr : it->second;
}

// Asks the resolver; "" when it accepted, else its reason.
std::string Resolve(int stage, const std::string& key, const std::string& spec) {
  const ResolveFn fn = resolver.load();
  if (fn == nullptr) {
    return "no resolver is installed (import tf_fusionstitch in this process)";
  }
  char err[kErrLen] = {0};
  const int rc = fn(stage, key.c_str(), spec.c_str(), err, kErrLen);
  err[kErrLen - 1] = '\0';
  if (rc == 0) return "";
  return err[0] ? std::string(err) : std::string("refused");
}

// At graph construction: a node whose kernel is neither registered nor
// checked has its spec checked now, so a bad one fails the graph's import
// (naming the node) before anything is compiled. Without a resolver the
// check waits for the kernel's construction.
absl::Status CheckSpec(const std::string& key, const std::string& spec) {
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = Registry().find(key);
    if (it != Registry().end() && it->second->spec == spec) return absl::OkStatus();
    auto seen = Checked().find(key);
    if (seen != Checked().end() && seen->second == spec) return absl::OkStatus();
  }
  if (resolver.load() == nullptr) return absl::OkStatus();
  const std::string why = Resolve(kCheckSpec, key, spec);
  if (!why.empty()) {
    return errors::InvalidArgument("FusionStitch: the fusion spec of kernel '", key,
                                   "' is refused: ", why);
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  Checked()[key] = spec;
  return absl::OkStatus();
}

bool SupportedDtype(DataType t) {
  switch (t) {
    case DT_FLOAT: case DT_DOUBLE: case DT_HALF: case DT_BFLOAT16:
    case DT_INT32: case DT_INT64: case DT_BOOL:
      return true;
    default:
      return false;
  }
}

// Decodes fs_meta, checking each count before it sizes a read.
bool DecodeMeta(const int64_t* meta, LoadedKernel* k, std::string* error) {
  if (meta[0] != kAbiVersion) {
    *error = "kernel ABI version " + std::to_string(meta[0]) +
             ", this op supports version " + std::to_string(kAbiVersion) +
             "; clear the tf_fusionstitch cache and rebuild";
    return false;
  }
  const int64_t n_in = meta[1], n_out = meta[2], n_ext = meta[3];
  if (n_in < 0 || n_in > kMaxCount || n_out < 1 || n_out > kMaxCount ||
      n_ext < 0 || n_ext > kMaxCount) {
    *error = "fs_meta has invalid counts n_in=" + std::to_string(n_in) +
             " n_out=" + std::to_string(n_out) + " n_ext=" + std::to_string(n_ext);
    return false;
  }
  k->n_in = static_cast<int>(n_in);
  k->n_out = static_cast<int>(n_out);
  k->n_ext = static_cast<int>(n_ext);
  for (int64_t i = 0; i < n_in + n_out; ++i) {
    const int64_t rank = meta[4 + i];
    if (rank < 0 || rank > kMaxRank) {
      *error = "fs_meta has invalid rank " + std::to_string(rank);
      return false;
    }
    (i < n_in ? k->in_ranks : k->out_ranks).push_back(static_cast<int>(rank));
  }
  // Dtype codes are DataType enum numbers (docs/KERNEL_ABI.md).
  for (int64_t i = 0; i < n_in + n_out; ++i) {
    const int64_t code = meta[4 + n_in + n_out + i];
    // Range first: only a valid enum value may be cast to DataType.
    if (code <= 0 || code > DataType_MAX ||
        !SupportedDtype(static_cast<DataType>(code))) {
      *error = "fs_meta has unsupported dtype code " + std::to_string(code) +
               " for " + (i < n_in ? "input " : "output ") +
               std::to_string(i < n_in ? i : i - n_in);
      return false;
    }
    (i < n_in ? k->in_dtypes : k->out_dtypes).push_back(static_cast<DataType>(code));
  }
  const int64_t at = 4 + 2 * (n_in + n_out);
  const int64_t n_fwd = meta[at];
  if (n_fwd < 0 || n_fwd > n_in * n_out) {
    *error = "fs_meta has invalid n_fwd " + std::to_string(n_fwd);
    return false;
  }
  k->forward_candidates.assign(n_out, {});
  for (int64_t p = 0; p < n_fwd; ++p) {
    const int64_t out = meta[at + 1 + 2 * p], in = meta[at + 2 + 2 * p];
    if (out < 0 || out >= n_out || in < 0 || in >= n_in) {
      *error = "fs_meta forward pair (" + std::to_string(out) + ", " +
               std::to_string(in) + ") names no such output/input";
      return false;
    }
    k->forward_candidates[out].push_back(static_cast<int>(in));
  }
  return true;
}

// An ABI symbol of the kernel whose suffix is `symbol` ("" for plain names).
std::string AbiName(const char* name, const std::string& symbol) {
  return symbol.empty() ? std::string(name) : std::string(name) + "_" + symbol;
}

int Register(const char* key, const char* so_path, const char* spec,
             const char* symbol) {
  if (key == nullptr || so_path == nullptr || spec == nullptr || symbol == nullptr) {
    return Fail("fs_register_kernel: key, so_path, spec and symbol must not be null");
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = Registry().find(key);
  if (it != Registry().end()) {
    if (it->second->spec == spec) return 0;  // idempotent
    return Fail(std::string("kernel key '") + key +
                "' is already registered with a different spec; keys must be "
                "the content hash of their spec");
  }
  // RTLD_LOCAL: kernels compiled alone export the same symbol names, so keep
  // them apart. A library opened again returns the handle it already has.
  void* handle = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Fail(std::string("cannot load kernel ") + so_path + ": " +
                (why ? why : "unknown dlopen error"));
  }
  auto kernel = std::make_shared<LoadedKernel>();
  kernel->spec = spec;
  kernel->so_path = so_path;
  kernel->symbol = symbol;
  const std::string& sym = kernel->symbol;
  auto* meta =
      static_cast<const int64_t*>(dlsym(handle, AbiName("fs_meta", sym).c_str()));
  kernel->shape =
      reinterpret_cast<ShapeFn>(dlsym(handle, AbiName("fs_shape", sym).c_str()));
  kernel->run = reinterpret_cast<RunFn>(dlsym(handle, AbiName("fs_run", sym).c_str()));
  kernel->check = reinterpret_cast<CheckFn>(
      dlsym(handle, AbiName("fs_check_inputs", sym).c_str()));
  std::string error;
  if (meta == nullptr || kernel->shape == nullptr || kernel->run == nullptr) {
    error = "does not export " + AbiName("fs_meta", sym) + ", " +
            AbiName("fs_shape", sym) + " and " + AbiName("fs_run", sym) +
            " (they need extern \"C\" and visibility(\"default\"))";
  } else {
    DecodeMeta(meta, kernel.get(), &error);
  }
  if (!error.empty()) {
    dlclose(handle);
    return Fail(std::string("kernel ") + so_path + ": " + error);
  }
  Registry().emplace(key, std::move(kernel));
  return 0;
}

std::string ShapeString(const int64_t* dims, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// ---- The GPU launch, in code every build compiles ---------------------------

// A CUDA kernel's launch geometry (gpu/mapping.py's GpuMapping).
struct GpuGeometry {
  int block_threads = 0;
  int rows_per_block = 0;
  int row_blocks = 1;   // > 1: a split row (one launch per phase)
  int phases = 1;
  std::vector<int> workspace_bytes;   // per workspace array: bytes of an element
};

constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;

// One launch over work items [begin, end) with `grid` blocks.
struct Launch {
  int64_t begin, end, grid;
};

// The launches covering work items [0, work): as runtime/cuda_kernel.launches,
// each at most kMaxGridX blocks, `row_blocks` blocks a row.
std::vector<Launch> Launches(int64_t work, int64_t rows_per_block, int64_t row_blocks) {
  std::vector<Launch> out;
  if (rows_per_block < 1 || row_blocks < 1) return out;
  const int64_t per_launch = kMaxGridX / row_blocks * rows_per_block;
  for (int64_t begin = 0; begin < work; begin += per_launch) {
    const int64_t end = std::min(work, begin + per_launch);
    out.push_back({begin, end, (end - begin + rows_per_block - 1) / rows_per_block *
                                   row_blocks});
  }
  return out;
}

// The parameters of fs_kernel (docs/KERNEL_ABI.md) for one launch: begin, end,
// the buffers, the n_ext extents, and for a split row the phase and the
// workspace arrays. `pointers()` is cuLaunchKernel's kernelParams: each
// entry points at the value of one parameter, held here.
class KernelArgs {
 public:
  KernelArgs(const Launch& launch, const std::vector<void*>& buffers,
             const int64_t* ext, int n_ext, int phase,
             const std::vector<void*>& workspace)
      : begin_(launch.begin), end_(launch.end), buffers_(buffers),
        ext_(ext, ext + n_ext), phase_(phase), workspace_(workspace) {
    params_.push_back(&begin_);
    params_.push_back(&end_);
    for (void*& b : buffers_) params_.push_back(&b);
    for (int64_t& e : ext_) params_.push_back(&e);
    if (!workspace_.empty()) {
      params_.push_back(&phase_);
      for (void*& w : workspace_) params_.push_back(&w);
    }
  }
  KernelArgs(const KernelArgs&) = delete;
  KernelArgs& operator=(const KernelArgs&) = delete;
  void** pointers() { return params_.data(); }
  size_t count() const { return params_.size(); }

 private:
  int64_t begin_, end_;
  std::vector<void*> buffers_;
  std::vector<int64_t> ext_;
  int phase_;
  std::vector<void*> workspace_;
  std::vector<void*> params_;
};

}  // namespace fusion_stitch

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("FusionStitch")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("output_shapes: list(shape)")
    .Attr("spec: string")
    .Attr("kernel_key: string")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return errors::InvalidArgument(
            "FusionStitch: output_shapes has ", shapes.size(),
            " entries but Tout has ", c->num_outputs());
      }
      std::string key, spec;
      TF_RETURN_IF_ERROR(c->GetAttr("kernel_key", &key));
      TF_RETURN_IF_ERROR(c->GetAttr("spec", &spec));
      TF_RETURN_IF_ERROR(fusion_stitch::CheckSpec(key, spec));
      for (int i = 0; i < c->num_outputs(); ++i) {
        ShapeHandle h;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &h));
        c->set_output(i, h);
      }
      return absl::OkStatus();
    });

class FusionStitchOp : public OpKernel {
 public:
  explicit FusionStitchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string spec;
    std::vector<DataType> tin, tout;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kernel_key", &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spec", &spec));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tin", &tin));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &tout));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &output_shapes_));

    kernel_ = fusion_stitch::Lookup(key_);
    std::string why;
    if (kernel_ == nullptr) {
      // A graph from elsewhere (a SavedModel): built from its validated spec.
      why = fusion_stitch::Resolve(fusion_stitch::kBuildKernels, key_, spec);
      kernel_ = fusion_stitch::Lookup(key_);
    }
    OP_REQUIRES(
        ctx, kernel_ != nullptr,
        errors::FailedPrecondition(
            "FusionStitch kernel '", key_, "' (node ", name(),
            ") is not loaded in this process and cannot be built from the "
            "node's spec: ", why.empty() ? "it was not registered" : why,
            ". Graphs with FusionStitch nodes come from tf_fusionstitch.optimize "
            "or a SavedModel that tf_fusionstitch converted; import "
            "tf_fusionstitch before loading one."));
    // Never trust the graph: the node must carry the spec the kernel was
    // generated from.
    OP_REQUIRES(ctx, kernel_->spec == spec,
                errors::InvalidArgument(
                    "FusionStitch node ", name(), ": its spec differs from the "
                    "spec kernel '", key_, "' was generated from; the graph "
                    "was altered or the key is stale. Re-run "
                    "tf_fusionstitch.optimize on the original function."));
    const int n_in = static_cast<int>(tin.size());
    const int n_out = static_cast<int>(tout.size());
    OP_REQUIRES(ctx, n_in == kernel_->n_in && n_out == kernel_->n_out,
                errors::InvalidArgument(
                    "FusionStitch node ", name(), " has ", n_in, " inputs and ",
                    n_out, " outputs but kernel '", key_, "' takes ",
                    kernel_->n_in, " and produces ", kernel_->n_out));
    OP_REQUIRES(ctx, static_cast<int>(output_shapes_.size()) == n_out,
                errors::InvalidArgument("FusionStitch node ", name(), ": ",
                                        output_shapes_.size(),
                                        " output_shapes for ", n_out, " outputs"));
    for (int i = 0; i < n_in + n_out; ++i) {
      const DataType t = i < n_in ? tin[i] : tout[i - n_in];
      OP_REQUIRES(ctx, fusion_stitch::SupportedDtype(t),
                  errors::InvalidArgument(
                      "FusionStitch node ", name(), ": ",
                      i < n_in ? "input " : "output ", i < n_in ? i : i - n_in,
                      " has dtype ", DataTypeString(t),
                      "; fused kernels take float, double, half, bfloat16, "
                      "int32, int64 and bool"));
      // The kernel reads and writes its buffers as the dtypes it was
      // generated for; a node claiming others must not reach it.
      const DataType want =
          i < n_in ? kernel_->in_dtypes[i] : kernel_->out_dtypes[i - n_in];
      OP_REQUIRES(ctx, t == want,
                  errors::InvalidArgument(
                      "FusionStitch node ", name(), ": ", i < n_in ? "Tin[" : "Tout[",
                      i < n_in ? i : i - n_in, "] is ", DataTypeString(t),
                      " but kernel '", key_, "' was generated for ",
                      DataTypeString(want)));
    }
    for (int i = 0; i < n_out; ++i) {
      const PartialTensorShape& s = output_shapes_[i];
      OP_REQUIRES(ctx, s.unknown_rank() || s.dims() == kernel_->out_ranks[i],
                  errors::InvalidArgument(
                      "FusionStitch node ", name(), ": output_shapes[", i,
                      "] has rank ", s.dims(), " but kernel '", key_,
                      "' produces rank ", kernel_->out_ranks[i]));
    }
  }

 protected:
  // One call's run-time extents, work items and buffers (inputs, then outputs).
  struct Call {
    std::vector<int64_t> ext;
    int64_t work[2] = {0, 0};
    std::vector<void*> bufs;
  };

  // What every device does before it runs the kernel: the input ranks
  // checked, fs_shape run, the inputs' values checked (fs_check_inputs, on
  // the host: a kernel with such a check has no GPU kernel), the outputs
  // allocated in the device's memory. On failure the context's status says
  // why.
  void PrepareCall(OpKernelContext* ctx, Call* call) {
    const fusion_stitch::LoadedKernel& k = *kernel_;

    std::vector<int64_t> in_dims;
    for (int i = 0; i < k.n_in; ++i) {
      const TensorShape& s = ctx->input(i).shape();
      OP_REQUIRES(ctx, s.dims() == k.in_ranks[i],
                  errors::InvalidArgument(
                      "FusionStitch node ", name(), ": input ", i, " has shape ",
                      s.DebugString(), " (rank ", s.dims(), ") but the kernel takes rank ",
                      k.in_ranks[i]));
      for (int d = 0; d < s.dims(); ++d) in_dims.push_back(s.dim_size(d));
    }

    int total_out_rank = 0;
    for (int r : k.out_ranks) total_out_rank += r;
    // Never empty, so the kernel always receives valid pointers.
    std::vector<int64_t> out_dims(std::max(1, total_out_rank), 0);
    std::vector<int64_t>& ext = call->ext;
    ext.assign(std::max(1, k.n_ext), 0);
    if (in_dims.empty()) in_dims.push_back(0);
    int64_t* work = call->work;
    char err[fusion_stitch::kErrLen] = {0};
    const int rc = k.shape(in_dims.data(), out_dims.data(), ext.data(), work, err,
                           fusion_stitch::kErrLen);
    err[fusion_stitch::kErrLen - 1] = '\0';
    OP_REQUIRES(ctx, rc == 0,
                errors::InvalidArgument("FusionStitch node ", name(), ": ",
                                        err[0] ? err : "the kernel rejected its input shapes"));
    OP_REQUIRES(ctx, work[0] >= 0,
                errors::Internal("FusionStitch kernel '", key_, "' returned ",
                                 work[0], " work items"));

    std::vector<void*>& bufs = call->bufs;
    bufs.assign(k.n_in + k.n_out, nullptr);
    for (int i = 0; i < k.n_in; ++i) {
      bufs[i] = const_cast<char*>(ctx->input(i).tensor_data().data());
    }
    if (k.check != nullptr) {   // before any output exists, as TF's own kernel fails
      const int bad = k.check(ext.data(), bufs.data(), err, fusion_stitch::kErrLen);
      err[fusion_stitch::kErrLen - 1] = '\0';
      OP_REQUIRES(ctx, bad == 0,
                  errors::InvalidArgument("FusionStitch node ", name(), ": ",
                                          err[0] ? err : "the kernel rejected its inputs"));
    }
    const int64_t* dims = out_dims.data();
    for (int i = 0; i < k.n_out; ++i) {
      const int rank = k.out_ranks[i];
      TensorShape shape;
      OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(
                              absl::Span<const int64_t>(dims, rank), &shape));
      // The static shape promised to the graph must hold at run time.
      OP_REQUIRES(ctx, output_shapes_[i].IsCompatibleWith(shape),
                  errors::Internal(
                      "FusionStitch node ", name(), ": kernel '", key_,
                      "' computed output ", i, " shape ",
                      fusion_stitch::ShapeString(dims, rank),
                      ", incompatible with the declared ",
                      output_shapes_[i].DebugString()));
      dims += rank;
      Tensor* out = nullptr;
      // Reusing a dead input's buffer avoids page faults on a fresh output;
      // TF forwards only when dtype and size match and nobody else holds it.
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              k.forward_candidates[i], i, shape, &out));
      bufs[k.n_in + i] = const_cast<char*>(out->tensor_data().data());
    }
  }

  std::string key_;
  std::vector<PartialTensorShape> output_shapes_;
  std::shared_ptr<const fusion_stitch::LoadedKernel> kernel_;
};

// On the CPU: fs_run over the work items on TensorFlow's intra-op threads.
class FusionStitchCpuOp : public FusionStitchOp {
 public:
  using FusionStitchOp::FusionStitchOp;

  void Compute(OpKernelContext* ctx) override {
    Call call;
    PrepareCall(ctx, &call);
    if (!ctx->status().ok() || call.work[0] == 0) return;
    const fusion_stitch::RunFn run = kernel_->run;
    const int64_t* ext_ptr = call.ext.data();
    void* const* buf_ptr = call.bufs.data();
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, call.work[0],
          std::max<int64_t>(1, call.work[1]),
          [run, ext_ptr, buf_ptr](int64_t begin, int64_t end) {
            run(begin, end, ext_ptr, buf_ptr);
          });
  }
};

REGISTER_KERNEL_BUILDER(Name("FusionStitch").Device(DEVICE_CPU), FusionStitchCpuOp);

#if GOOGLE_CUDA
namespace fusion_stitch {

// A registered cubin and its launch geometry. The module is loaded once per
// CUDA context (a process may drive several GPUs).
struct CudaKernel {
  std::string cubin;
  GpuGeometry geometry;
  std::mutex mu;
  std::unordered_map<CUcontext, CUfunction> functions;
};

std::unordered_map<std::string, std::shared_ptr<CudaKernel>>& CudaRegistry() {
  static auto* registry = new std::unordered_map<std::string, std::shared_ptr<CudaKernel>>();
  return *registry;
}

std::shared_ptr<CudaKernel> LookupCuda(const std::string& key) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = CudaRegistry().find(key);
  return it == CudaRegistry().end() ? nullptr : it->second;
}

std::string CudaError(CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  cuGetErrorName(rc, &name);
  cuGetErrorString(rc, &text);
  return std::string(name ? name : "CUDA error") + ": " + (text ? text : "");
}

// Makes the CUDA context of `stream` current for its lifetime: the module
// loads and the launches happen in the context TF's stream belongs to.
class StreamContext {
 public:
  explicit StreamContext(CUstream stream) {
    rc_ = cuStreamGetCtx(stream, &context_);
    if (rc_ == CUDA_SUCCESS) rc_ = cuCtxPushCurrent(context_);
    pushed_ = rc_ == CUDA_SUCCESS;
  }
  ~StreamContext() {
    CUcontext popped = nullptr;
    if (pushed_) cuCtxPopCurrent(&popped);
  }
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;
  CUresult status() const { return rc_; }
  CUcontext context() const { return context_; }

 private:
  CUcontext context_ = nullptr;
  CUresult rc_ = CUDA_SUCCESS;
  bool pushed_ = false;
};

// fs_kernel of `kernel` in `context` (current), loaded on first use.
absl::Status FunctionInContext(CudaKernel* kernel, CUcontext context,
                               CUfunction* function) {
  std::lock_guard<std::mutex> lock(kernel->mu);
  auto it = kernel->functions.find(context);
  if (it != kernel->functions.end()) {
    *function = it->second;
    return absl::OkStatus();
  }
  CUmodule module = nullptr;
  CUresult rc = cuModuleLoadData(&module, kernel->cubin.data());
  if (rc == CUDA_SUCCESS) rc = cuModuleGetFunction(function, module, "fs_kernel");
  if (rc != CUDA_SUCCESS) {
    return errors::Internal("FusionStitch: cannot load the kernel's cubin (",
                            CudaError(rc), ")");
  }
  kernel->functions.emplace(context, *function);
  return absl::OkStatus();
}

}  // namespace fusion_stitch

// On a GPU: the CUDA kernel, launched on TensorFlow's stream for this op,
// on the buffers TensorFlow allocated; no host copy, no Python.
class FusionStitchGpuOp : public FusionStitchOp {
 public:
  explicit FusionStitchGpuOp(OpKernelConstruction* ctx) : FusionStitchOp(ctx) {
    if (!ctx->status().ok()) return;
    cuda_ = fusion_stitch::LookupCuda(key_);
    OP_REQUIRES(ctx, cuda_ != nullptr,
                errors::FailedPrecondition(
                    "FusionStitch node ", name(), " is placed on a GPU but kernel '",
                    key_, "' has no CUDA kernel registered in this process; "
                    "tf_fusionstitch.optimize registers one for the GPU target"));
    OP_REQUIRES(ctx, kernel_->check == nullptr,
                errors::FailedPrecondition(
                    "FusionStitch node ", name(), ": kernel '", key_,
                    "' checks its inputs' values on the host and has no GPU kernel"));
  }

  void Compute(OpKernelContext* ctx) override {
    Call call;
    PrepareCall(ctx, &call);
    if (!ctx->status().ok() || call.work[0] == 0) return;
    const fusion_stitch::GpuGeometry& g = cuda_->geometry;
    se::Stream* stream = ctx->op_device_context()->stream();
    OP_REQUIRES(ctx, stream != nullptr,
                errors::Internal("FusionStitch node ", name(), ": no GPU stream"));
    CUstream cu_stream =
        reinterpret_cast<CUstream>(stream->platform_specific_handle().stream);
    fusion_stitch::StreamContext scoped(cu_stream);
    OP_REQUIRES(ctx, scoped.status() == CUDA_SUCCESS,
                errors::Internal("FusionStitch node ", name(), ": the stream's CUDA "
                                 "context (", fusion_stitch::CudaError(scoped.status()), ")"));
    CUfunction function = nullptr;
    OP_REQUIRES_OK(ctx, fusion_stitch::FunctionInContext(cuda_.get(), scoped.context(),
                                                         &function));
    // A split row's partials: one element per (work item, slice) each.
    std::vector<Tensor> workspace_tensors;
    std::vector<void*> workspace;
    for (int bytes : g.workspace_bytes) {
      Tensor t;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              DT_INT8, TensorShape({call.work[0] * g.row_blocks * bytes}),
                              &t));
      workspace.push_back(const_cast<char*>(t.tensor_data().data()));
      workspace_tensors.push_back(std::move(t));
    }
    const auto launches =
        fusion_stitch::Launches(call.work[0], g.rows_per_block, g.row_blocks);
    for (int phase = 0; phase < g.phases; ++phase) {
      for (const fusion_stitch::Launch& launch : launches) {
        fusion_stitch::KernelArgs args(launch, call.bufs, call.ext.data(), kernel_->n_ext,
                                       phase, workspace);
        const CUresult rc = cuLaunchKernel(
            function, static_cast<unsigned>(launch.grid), 1, 1,
            static_cast<unsigned>(g.block_threads), 1, 1, 0, cu_stream, args.pointers(),
            nullptr);
        OP_REQUIRES(ctx, rc == CUDA_SUCCESS,
                    errors::Internal("FusionStitch node ", name(), ": launch failed (",
                                     fusion_stitch::CudaError(rc), ")"));
      }
    }
  }

 private:
  std::shared_ptr<fusion_stitch::CudaKernel> cuda_;
};

REGISTER_KERNEL_BUILDER(Name("FusionStitch").Device(DEVICE_GPU), FusionStitchGpuOp);
#endif  // GOOGLE_CUDA

}  // namespace tensorflow

// C entry points for Python (custom_ops/loader.py) via ctypes on the same
// library handle as tf.load_op_library, so they share the registry above.
extern "C" {

// Registers the kernel in `so_path` whose ABI symbols carry the suffix
// `symbol` ("" for plain fs_meta, ...), generated from `spec`, under `key`.
// Returns 0, or non-zero with the reason in fs_last_error(). Registering the
// same key with the same spec again is a no-op.
__attribute__((visibility("default"))) int fs_register_kernel(const char* key,
                                                              const char* so_path,
                                                              const char* spec,
                                                              const char* symbol) {
  return tensorflow::fusion_stitch::Register(key, so_path, spec, symbol);
}

// Installs the resolver for keys this process has not registered (nullptr
// removes it).
__attribute__((visibility("default"))) void fs_set_resolver(
    tensorflow::fusion_stitch::ResolveFn fn) {
  tensorflow::fusion_stitch::resolver.store(fn);
}

// The last fs_register_kernel error on this thread.
__attribute__((visibility("default"))) const char* fs_last_error() {
  return tensorflow::fusion_stitch::last_error.c_str();
}

// The GPU launches over `work` items (begin, end, grid per launch, written to
// `out` as triples, at most `max_launches`); returns their number. Every build
// exports it: the launch geometry is checked where no GPU is.
__attribute__((visibility("default"))) int64_t fs_launches(int64_t work,
                                                          int64_t rows_per_block,
                                                          int64_t row_blocks,
                                                          int64_t* out,
                                                          int64_t max_launches) {
  const auto launches =
      tensorflow::fusion_stitch::Launches(work, rows_per_block, row_blocks);
  const int64_t n = static_cast<int64_t>(launches.size());
  for (int64_t i = 0; i < std::min(n, max_launches); ++i) {
    out[3 * i] = launches[i].begin;
    out[3 * i + 1] = launches[i].end;
    out[3 * i + 2] = launches[i].grid;
  }
  return n;
}

#if GOOGLE_CUDA
// Registers the CUDA kernel (a cubin for this GPU's architecture) of the
// kernel registered under `key` with target "cuda-emulated", whose fs_meta and
// fs_shape are its host side. `workspace_bytes`: n_workspace element sizes.
__attribute__((visibility("default"))) int fs_register_cuda_kernel(
    const char* key, const char* cubin, int64_t cubin_len, int block_threads,
    int rows_per_block, int row_blocks, int phases, int n_workspace,
    const int* workspace_bytes) {
  namespace fs = tensorflow::fusion_stitch;
  if (key == nullptr || cubin == nullptr || cubin_len <= 0 || block_threads <= 0 ||
      rows_per_block <= 0 || row_blocks <= 0 || phases <= 0 || n_workspace < 0) {
    return fs::Fail("fs_register_cuda_kernel: invalid arguments");
  }
  if (fs::Lookup(key) == nullptr) {
    return fs::Fail(std::string("fs_register_cuda_kernel: register kernel '") + key +
                    "' (its host part) first");
  }
  auto kernel = std::make_shared<fs::CudaKernel>();
  kernel->cubin.assign(cubin, cubin_len);
  kernel->geometry.block_threads = block_threads;
  kernel->geometry.rows_per_block = rows_per_block;
  kernel->geometry.row_blocks = row_blocks;
  kernel->geometry.phases = phases;
  kernel->geometry.workspace_bytes.assign(workspace_bytes, workspace_bytes + n_workspace);
  std::lock_guard<std::mutex> lock(fs::registry_mu);
  fs::CudaRegistry().emplace(key, std::move(kernel));
  return 0;
}
#endif  // GOOGLE_CUDA

}  // extern "C"
