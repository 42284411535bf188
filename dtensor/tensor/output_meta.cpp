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
// the identity. Random ops without a Generator argument are inferred through their
// re-expression, which takes one (native_dropout has no meta kernel either); no inference
// draws from the caller's generator or the default one.
#include "dtensor/tensor/output_meta_internal.h"

#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/tensor/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <string>
#include <unordered_set>

namespace dtensor {
namespace detail {
namespace {

enum class StandIn { kMeta, kZeros, kIdentity };

// A stand-in with the DTensor's global shape, strides and storage offset.
at::Tensor stand_in_for(const DTensorSpec& s, StandIn kind) {
  const bool meta = kind == StandIn::kMeta;
  const TensorMeta& m = s.tensor_meta;
  const auto options = at::TensorOptions().dtype(m.dtype).device(meta ? at::kMeta : at::kCPU);
  int64_t extent = 1;  // storage elements the strides reach
  for (size_t d = 0; d < m.shape.size(); ++d) {
    if (m.shape[d] == 0) extent = 0;
    if (extent > 0) extent += (m.shape[d] - 1) * m.stride[d];
  }
  const int64_t storage = m.storage_offset + extent;
  at::Tensor t = (meta ? at::empty({storage}, options) : at::zeros({storage}, options)).as_strided(m.shape, m.stride, m.storage_offset);
  if (kind == StandIn::kIdentity) (t.dim() >= 2 ? t.diagonal(0, -2, -1) : t).fill_(1);
  return t;
}

bool is_generator_argument(const c10::IValue& v, const c10::Argument& a) {
  const auto& type = a.type();
  return v.isGenerator() ||
         (v.isNone() && type->kind() == c10::TypeKind::OptionalType &&
          type->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType);
}

// The op's returns, run on stand-ins of `kind`.
torch::jit::Stack run_on_stand_ins(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                   const ops::OpCall& call, StandIn kind) {
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

// The ops whose meta run failed once. A c10::Error records a symbolised backtrace (~1 ms with
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
  if (!without_meta.contains(call.name)) {
    try {
      ms = run_on_stand_ins(op, args, call, StandIn::kMeta);
      have = true;
    } catch (const c10::Error&) {
      without_meta.add(call.name);
    }
  }
  if (!have) {
    try {
      ms = run_on_stand_ins(op, args, call, StandIn::kZeros);
    } catch (const c10::Error& e) {
      try {
        ms = run_on_stand_ins(op, args, call, StandIn::kIdentity);
      } catch (const c10::Error&) {
        TORCH_CHECK(false, "DTensor: computing the output shape of ", call.name, " failed: ", e.what_without_backtrace());
      }
    }
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
