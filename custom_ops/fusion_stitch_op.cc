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

  void Compute(OpKernelContext* ctx) override {
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
    std::vector<int64_t> ext(std::max(1, k.n_ext), 0);
    if (in_dims.empty()) in_dims.push_back(0);
    int64_t work[2] = {0, 0};
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

    std::vector<void*> bufs(k.n_in + k.n_out, nullptr);
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

    if (work[0] == 0) return;
    const RunFn run = k.run;
    const int64_t* ext_ptr = ext.data();
    void* const* buf_ptr = bufs.data();
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, work[0],
          std::max<int64_t>(1, work[1]),
          [run, ext_ptr, buf_ptr](int64_t begin, int64_t end) {
            run(begin, end, ext_ptr, buf_ptr);
          });
  }

 private:
  using RunFn = fusion_stitch::RunFn;
  std::string key_;
  std::vector<PartialTensorShape> output_shapes_;
  std::shared_ptr<const fusion_stitch::LoadedKernel> kernel_;
};

REGISTER_KERNEL_BUILDER(Name("FusionStitch").Device(DEVICE_CPU), FusionStitchOp);

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

}  // extern "C"
