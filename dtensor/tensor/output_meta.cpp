// dtensor/tensor/output_meta.cpp: the outputs' global metadata for the DTensor fallback.
//
// NOTE: [Output metadata without the data]
// Propagation needs the global shape, strides and dtype of each output (NOTE: [DTensor
// fallback] step 2; cached with the strategy, so this runs once per op and input metadata).
// The op runs on stand-ins of its DTensor arguments with their global metadata: meta tensors,
// which cost nothing. An op without a meta kernel in this libtorch (relu in 1.13, ...) runs on
// zero-filled CPU stand-ins instead, else on CPU stand-ins holding identity matrices (ones on
// the diagonal of the last two dims, ones for fewer dims): zero matrices are singular, and the
// ops without a meta kernel that refuse them (cholesky, cholesky_inverse in libtorch 1.13) take
// the identity. Those CPU stand-ins are the inputs' unsharded tensors, which sharding exists to
// avoid: they may take at most ops::kStandInLimitBytes on each rank (set_stand_in_limit_bytes),
// and beyond that the op raises, naming itself, instead of allocating them. With a meta kernel
// nothing of global size is allocated, so an op on a tensor no rank could hold (2^40
// elements, each rank's piece small) runs. Random ops without a Generator argument are inferred through their
// re-expression, which takes one (native_dropout has no meta kernel either); no inference
// draws from the caller's generator or the default one.
#include "dtensor/tensor/output_meta_internal.h"
#include "dtensor/debug/tracking_allocator_internal.h"

#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/tensor/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <algorithm>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_set>

namespace dtensor {
namespace detail {

bool is_generator_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  return t->kind() == c10::TypeKind::OptionalType &&
         t->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType;
}

namespace {

enum class StandIn { kMeta, kZeros, kIdentity };

// Storage elements a tensor of metadata `m` reaches.
int64_t storage_elements(const TensorMeta& m) {
  int64_t extent = 1;
  for (size_t d = 0; d < m.shape.size(); ++d) {
    if (m.shape[d] == 0) extent = 0;
    if (extent > 0) extent += (m.shape[d] - 1) * m.stride[d];
  }
  return m.storage_offset + extent;
}

// A stand-in with the DTensor's global shape, strides and storage offset.
at::Tensor stand_in_for(const DTensorSpec& s, StandIn kind) {
  const bool meta = kind == StandIn::kMeta;
  const TensorMeta& m = s.tensor_meta;
  const auto options = at::TensorOptions().dtype(m.dtype).device(meta ? at::kMeta : at::kCPU);
  const int64_t storage = storage_elements(m);
  at::Tensor t = (meta ? at::empty({storage}, options) : at::zeros({storage}, options)).as_strided(m.shape, m.stride, m.storage_offset);
  if (kind == StandIn::kIdentity) (t.dim() >= 2 ? t.diagonal(0, -2, -1) : t).fill_(1);
  return t;
}

std::atomic<int64_t>& stand_in_limit() {
  static std::atomic<int64_t> limit{ops::kStandInLimitBytes};
  return limit;
}

// Bytes of the CPU stand-ins of the call's DTensor arguments.
int64_t stand_in_bytes(const ops::OpCall& call) {
  int64_t bytes = 0;
  for (const DTensorSpec* s : call.inputs)
    bytes += storage_elements(s->tensor_meta) * static_cast<int64_t>(c10::elementSize(s->tensor_meta.dtype));
  return bytes;
}

std::string mib(int64_t bytes) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return o.str();
}

// The first sentence of an error (libtorch's "Could not run 'aten::x' with arguments from the
// 'Meta' backend. This could be because ..." goes on for a page).
std::string first_sentence(const std::string& what) {
  size_t end = what.find_first_of(".\n");
  if (end == std::string::npos || end > 300) end = std::min<size_t>(what.size(), 300);
  return what.substr(0, end);
}

// Raises, naming the op and why the meta run failed, when its CPU stand-ins would exceed the
// limit.
void check_stand_in_size(const ops::OpCall& call, const std::string& meta_error) {
  const int64_t bytes = stand_in_bytes(call), limit = stand_in_limit().load();
  TORCH_CHECK(bytes <= limit, "DTensor: the output shape of ", call.name, " could not be computed on meta tensors (",
              meta_error.empty() ? std::string("it has no meta kernel in this libtorch") : first_sentence(meta_error),
              "), and computing it on zero-filled tensors of its inputs' global shapes would take ", mib(bytes),
              " on every rank, over the limit of ", mib(limit),
              " (a sharded op must not allocate its unsharded inputs). Run it on the local tensors "
              "(to_local, then from_local), or raise the limit with dtensor::ops::set_stand_in_limit_bytes");
}

bool is_generator_argument(const c10::IValue& v, const c10::Argument& a) {
  return v.isGenerator() || (v.isNone() && detail::is_generator_type(a.type()));
}

// The op's returns, run on stand-ins of `kind`.
torch::jit::Stack run_on_stand_ins(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                   const ops::OpCall& call, StandIn kind) {
  // Meta stand-ins (and the meta outputs of the run) hold nothing: no MemTracker counts them,
  // even on a fake world on the meta device, whose own meta tensors it counts. CPU stand-ins are
  // real memory and count.
  std::optional<debug::detail::UntrackedScope> untracked;
  if (kind == StandIn::kMeta) untracked.emplace();
  torch::jit::Stack ms = args;
  const auto& schema_args = op.schema().arguments();
  for (size_t i = 0; i < ms.size(); ++i) {
    const auto& a = call.args[i];
    if (a.kind == ops::ArgInfo::Kind::kDTensor) {
      ms[i] = stand_in_for(*a.spec, kind);
    } else if (a.kind == ops::ArgInfo::Kind::kDTensorList) {
      for (size_t k = 0; k < a.list.size(); ++k)
        ms[i] = with_list_element(ms[i], static_cast<size_t>(a.list_index[k]), stand_in_for(a.list[k], kind));
    }
    if (is_generator_argument(ms[i], schema_args[i])) ms[i] = at::detail::createCPUGenerator();
  }
  // NOTE: libtorch 1.13's boxed wrapper of a kernel returning several references (out=
  // overloads with several outputs: std::tuple<Tensor&, Tensor&>) drops the arguments from
  // the stack and then copies its returns from the dropped slots: the stand-ins must stay
  // alive elsewhere, or the copies read freed tensors (heap corruption).
  const torch::jit::Stack keep_alive = ms;
  c10::impl::ExcludeDispatchKeyGuard no_dtensor(kDTensorKey);
  at::AutoDispatchBelowADInplaceOrView below;
  if (has_random_reexpression(call.name))
    run_random_reexpression(call.name, &ms, 0, at::detail::createCPUGenerator());
  else
    op.callBoxed(ms);
  return ms;
}

// The ops whose meta run failed and whose CPU run then succeeded. A c10::Error records a symbolised backtrace (~1 ms with
// libtorch's ~285 shared libraries), so such an op goes straight to the CPU run after that.
// Bounded by the number of operators.
class OpsWithoutMetaKernel {
 public:
  static OpsWithoutMetaKernel& get() {
    static OpsWithoutMetaKernel instance;
    return instance;
  }
  bool contains(const std::string& op) {
    std::lock_guard<std::mutex> lk(mu_);
    return names_.count(op) != 0;
  }
  void add(const std::string& op) {
    std::lock_guard<std::mutex> lk(mu_);
    names_.insert(op);
  }

 private:
  std::mutex mu_;
  std::unordered_set<std::string> names_;
};

bool returns_tensors(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns())
    if (r.type()->kind() == c10::TypeKind::TensorType || r.type()->kind() == c10::TypeKind::ListType) return true;
  return false;
}

}  // namespace

}  // namespace detail

int64_t ops::set_stand_in_limit_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "set_stand_in_limit_bytes: the limit must be at least 0 bytes, got ", bytes);
  return detail::stand_in_limit().exchange(bytes);
}

namespace detail {

c10::IValue with_list_element(const c10::IValue& v, size_t pos, const at::Tensor& t) {
  c10::List<c10::IValue> in = v.toList();
  c10::impl::GenericList out(in.elementType());
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) out.push_back(i == pos ? c10::IValue(t) : in.get(i));
  return c10::IValue(std::move(out));
}

std::vector<TensorMeta> infer_output_meta(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                          const ops::OpCall& call) {
  std::vector<TensorMeta> metas;
  if (!returns_tensors(op.schema())) return metas;
  auto& without_meta = OpsWithoutMetaKernel::get();
  torch::jit::Stack ms;
  bool have = false;
  const bool known_without_meta = without_meta.contains(call.name);
  std::string meta_error;  // empty when the op is known to have no meta kernel
  if (!known_without_meta) {
    try {
      ms = run_on_stand_ins(op, args, call, StandIn::kMeta);
      have = true;
    } catch (const c10::Error& e) {
      meta_error = e.what_without_backtrace();
    }
  }
  if (!have) {
    check_stand_in_size(call, meta_error);
    try {
      ms = run_on_stand_ins(op, args, call, StandIn::kZeros);
    } catch (const c10::Error& e) {
      try {
        ms = run_on_stand_ins(op, args, call, StandIn::kIdentity);
      } catch (const c10::Error&) {
        TORCH_CHECK(false, "DTensor: computing the output shape of ", call.name, " failed: ", e.what_without_backtrace());
      }
    }
    // Only an op that ran where its meta run failed lacks a meta kernel: a meta run that raised
    // for a genuine error (shapes that do not multiply) raised on CPU too, and is not recorded.
    if (!known_without_meta) without_meta.add(call.name);
  }
  std::vector<at::Tensor> outs;
  for (auto& v : ms) {
    if (v.isTensor()) outs.push_back(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector()) outs.push_back(t);
  }
  for (auto& t : outs)
    metas.push_back(t.defined() ? TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.storage_offset()}
                                : TensorMeta{});
  return metas;
}

}  // namespace detail
}  // namespace dtensor
