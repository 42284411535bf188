// dtensor/tensor/dispatch.cpp: the boxed fallback behind kDTensorKey (DESIGN.md D1).
//
// NOTE: [DTensor fallback]
// Autograd has already recorded the op when we get here (the key is below it). Steps:
//   1. Read the schema's arguments off the stack; DTensors give specs, plain 0-dim tensors are
//      scalars, any other plain tensor is an error naming the op (or Replicate inside an
//      ImplicitReplicationGuard).
//   2. Propagate sharding (dtensor/ops): the cheapest strategy and the outputs' global metadata
//      (from a run on meta tensors, cached with the strategy).
//   3. Redistribute inputs to the strategy's placements and put the local tensors on the stack.
//   4. Run the op on local tensors, below this key and below autograd; a random op runs on
//      global stand-ins with the RNG tracker instead (NOTE: [Random ops on DTensors]), and a
//      rule with a local kernel runs that kernel instead (ops::LocalKernel).
//   5. Wrap outputs as DTensors; in-place/out= returns give back the DTensor that was written.
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/tensor/random.h"
#include "dtensor/tensor/redistribute.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_set>

namespace dtensor {

namespace {

static_assert(kDTensorKey == c10::DispatchKey::Fake, "TORCH_LIBRARY_IMPL below names the key");

std::string op_name(const c10::FunctionSchema& s) {
  return s.overload_name().empty() ? s.name() : s.name() + "." + s.overload_name();
}

struct DTensorArg {
  size_t arg;            // schema argument index
  int64_t list_pos;      // -1 for a Tensor argument, else position in the TensorList
  at::Tensor dtensor;
};

at::Tensor meta_like(const DTensorSpec& s) {
  return at::empty_strided(s.tensor_meta.shape, s.tensor_meta.stride,
                           at::TensorOptions().dtype(s.tensor_meta.dtype).device(at::kMeta));
}

void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
}

void dtensor_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const size_t begin = stack->size() - n_args;
  ops::OpCall call;
  call.name = op_name(schema);
  call.schema = &schema;
  call.args.resize(n_args);
  std::vector<DTensorArg> dargs;
  std::optional<DeviceMesh> mesh;

  // 1. Arguments.
  auto adopt = [&](const at::Tensor& t, size_t i, int64_t pos) -> const DTensorSpec& {
    auto* impl = maybe_get_dtensor_impl(t);
    if (!mesh) mesh = impl->spec().mesh;
    TORCH_CHECK(*mesh == impl->spec().mesh, "DTensor: ", call.name, " got DTensors on different meshes: ",
                mesh->to_string(), " and ", impl->spec().mesh.to_string());
    dargs.push_back({i, pos, t});
    return impl->spec();
  };
  std::vector<size_t> plain_args;
  for (size_t i = 0; i < n_args; ++i) {
    c10::IValue& v = (*stack)[begin + i];
    auto& a = call.args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (is_dtensor(t)) {
        a.kind = ops::ArgInfo::Kind::kDTensor;
        a.spec = adopt(t, i, -1);
      } else {
        a.value = v;
        if (t.defined() && t.dim() > 0) plain_args.push_back(i);
      }
    } else if (v.isTensorList()) {
      auto ts = v.toTensorVector();
      bool any = false;
      for (auto& t : ts) any = any || is_dtensor(t);
      if (any) {
        a.kind = ops::ArgInfo::Kind::kDTensorList;
        for (size_t p = 0; p < ts.size(); ++p) {
          TORCH_CHECK(is_dtensor(ts[p]), "DTensor: ", call.name, " got a list mixing DTensors and plain tensors (element ",
                      p, "); distribute every tensor first");
          a.list.push_back(adopt(ts[p], i, static_cast<int64_t>(p)));
        }
      } else {
        a.value = v;
      }
    } else {
      a.value = v;
    }
  }
  TORCH_INTERNAL_ASSERT(mesh.has_value(), "DTensor fallback reached without a DTensor argument for ", call.name);
  for (size_t i : plain_args) {
    const at::Tensor& t = call.args[i].value.toTensor();
    TORCH_CHECK(ImplicitReplicationGuard::enabled(), "DTensor: ", call.name, " got a plain tensor of shape ",
                t.sizes(), " as argument '", schema.arguments()[i].name(), "' mixed with DTensors on ",
                mesh->to_string(),
                ". Distribute it (distribute_tensor / from_local) or run inside a "
                "dtensor::ImplicitReplicationGuard to treat it as replicated");
    at::Tensor rep = make_dtensor(t, DTensorSpec(*mesh, std::vector<Placement>(mesh->ndim(), Replicate{}),
                                                 TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}));
    (*stack)[begin + i] = rep;
    call.args[i].kind = ops::ArgInfo::Kind::kDTensor;
    call.args[i].spec = adopt(rep, i, -1);
    call.args[i].value = c10::IValue();
  }
  // Keep dargs in argument order (implicit replicas were appended last).
  std::stable_sort(dargs.begin(), dargs.end(), [](const DTensorArg& x, const DTensorArg& y) {
    return x.arg != y.arg ? x.arg < y.arg : x.list_pos < y.list_pos;
  });
  for (auto& d : dargs) call.inputs.push_back(&unsafe_get_dtensor_impl(d.dtensor)->spec());
  call.mesh = &*mesh;
  // The written argument of in-place / out= ops.
  int written_arg = -1;
  int written_dtensors = 0;
  for (const auto& r : schema.returns())
    if (r.alias_info() && r.alias_info()->isWrite())
      for (size_t i = 0; i < n_args; ++i) {
        const auto& ai = schema.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets()) {
          written_arg = static_cast<int>(i);
          written_dtensors += call.args[i].kind == ops::ArgInfo::Kind::kDTensor ? 1 : 0;
        }
      }
  // One written DTensor is kept in place (its placements fixed, returned as is); several
  // (max.dim_max, sort.values, ...) would need that for each, which propagation does not do.
  TORCH_CHECK(written_dtensors <= 1, "DTensor: ", call.name, " writes ", written_dtensors,
              " DTensor outputs; out= overloads with several outputs are not supported. Call the functional "
              "overload and copy_ its results into the outputs");
  for (size_t k = 0; k < dargs.size(); ++k)
    if (static_cast<int>(dargs[k].arg) == written_arg && dargs[k].list_pos < 0) call.written_input = static_cast<int>(k);

  // 2. Propagation (+ output metadata from meta tensors on a cache miss).
  auto infer_meta = [&]() {
    std::vector<TensorMeta> metas;
    bool any_tensor_return = false;
    for (const auto& r : schema.returns())
      any_tensor_return = any_tensor_return || r.type()->kind() == c10::TypeKind::TensorType ||
                          r.type()->kind() == c10::TypeKind::ListType;
    if (!any_tensor_return) return metas;
    // Meta tensors cost nothing; ops without a meta kernel in this libtorch (relu, ...) run
    // once on zero-filled CPU tensors of the global shapes instead (the result is cached).
    auto run_on = [&](bool meta) {
      torch::jit::Stack ms(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
      auto stand_in = [&](const DTensorSpec& s) {
        return meta ? meta_like(s)
                    : at::zeros(s.tensor_meta.shape, at::TensorOptions().dtype(s.tensor_meta.dtype))
                          .as_strided(s.tensor_meta.shape, s.tensor_meta.stride);
      };
      for (size_t i = 0; i < n_args; ++i) {
        auto& a = call.args[i];
        if (a.kind == ops::ArgInfo::Kind::kDTensor) ms[i] = stand_in(*a.spec);
        else if (a.kind == ops::ArgInfo::Kind::kDTensorList) {
          std::vector<at::Tensor> l;
          for (auto& s : a.list) l.push_back(stand_in(s));
          ms[i] = l;
        }
        // Inferring shapes must not draw from the caller's generator (or the default one).
        const auto& type = schema.arguments()[i].type();
        if (ms[i].isGenerator() || (ms[i].isNone() && type->kind() == c10::TypeKind::OptionalType &&
                                    type->expectRef<c10::OptionalType>().getElementType()->kind() ==
                                        c10::TypeKind::GeneratorType))
          ms[i] = at::detail::createCPUGenerator();
      }
      c10::impl::ExcludeDispatchKeyGuard no_dtensor(kDTensorKey);
      at::AutoDispatchBelowADInplaceOrView below;
      // Random ops without a Generator argument (native_dropout has no meta kernel either) are
      // inferred through their re-expression, which takes one.
      if (detail::has_random_reexpression(call.name))
        detail::run_random_reexpression(call.name, &ms, 0, at::detail::createCPUGenerator());
      else
        op.callBoxed(ms);
      return ms;
    };
    // NOTE: a c10::Error records a symbolised backtrace (~1 ms with libtorch's ~285 shared
    // libraries), so an op whose meta run failed once goes straight to the CPU run after that.
    static std::mutex no_meta_mu;
    static std::unordered_set<std::string> no_meta;
    bool try_meta;
    {
      std::lock_guard<std::mutex> lk(no_meta_mu);
      try_meta = no_meta.count(call.name) == 0;
    }
    torch::jit::Stack ms;
    bool have_meta = false;
    if (try_meta) {
      try {
        ms = run_on(/*meta=*/true);
        have_meta = true;
      } catch (const c10::Error&) {
        std::lock_guard<std::mutex> lk(no_meta_mu);
        no_meta.insert(call.name);
      }
    }
    if (!have_meta) {
      try {
        ms = run_on(/*meta=*/false);
      } catch (const c10::Error& e) {
        TORCH_CHECK(false, "DTensor: computing the output shape of ", call.name, " failed: ",
                    e.what_without_backtrace());
      }
    }
    std::vector<at::Tensor> outs;
    for (auto& v : ms) collect_tensors(v, outs);
    for (auto& t : outs)
      metas.push_back(t.defined() ? TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()} : TensorMeta{});
    return metas;
  };
  ops::OutputSharding sharding = ops::propagate(call, infer_meta);
  call.output_meta = sharding.output_meta;  // on a cache hit, propagate did not infer them
  if (sharding.replicate_fallback) ops::note_replicate_fallback_use();

  // 3. Redistribute inputs; local tensors onto the stack.
  std::vector<at::Tensor> written_dtensor;
  for (size_t k = 0; k < dargs.size(); ++k) {
    auto* impl = unsafe_get_dtensor_impl(dargs[k].dtensor);
    at::Tensor local = impl->local();
    if (!(impl->spec().placements == sharding.inputs[k])) {
      local = detail::redistribute_local(local, impl->spec(), sharding.inputs[k]);
    }
    c10::IValue& slot = (*stack)[begin + dargs[k].arg];
    if (dargs[k].list_pos < 0) {
      slot = local;
    } else {
      auto l = slot.toTensorVector();
      l[static_cast<size_t>(dargs[k].list_pos)] = local;
      slot = l;
    }
  }
  at::Tensor written;
  if (written_arg >= 0) {
    for (auto& d : dargs)
      if (static_cast<int>(d.arg) == written_arg) written = d.dtensor;
  }
  if (sharding.rewrite) {
    std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
    sharding.rewrite(args, call, sharding.outputs);
    for (size_t i = 0; i < n_args; ++i) (*stack)[begin + i] = std::move(args[i]);
  }

  // 4. The local op (a random op: NOTE: [Random ops on DTensors]; a rule's local kernel).
  {
    c10::impl::ExcludeDispatchKeyGuard no_dtensor(kDTensorKey);
    at::AutoDispatchBelowADInplaceOrView below;
    if (sharding.random) {
      std::vector<detail::RandomOpInput> random_inputs;
      for (size_t k = 0; k < dargs.size(); ++k)
        random_inputs.push_back({dargs[k].arg, dargs[k].list_pos, sharding.inputs[k], &call.inputs[k]->tensor_meta});
      detail::run_random_op(op, stack, begin, *mesh, random_inputs, sharding.outputs, written_arg);
    } else if (sharding.kernel) {
      std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
      std::vector<c10::IValue> rets = sharding.kernel(op, args, call, sharding);
      TORCH_INTERNAL_ASSERT(rets.size() == schema.returns().size(), "the local kernel of ", call.name, " returned ",
                            rets.size(), " values; the op returns ", schema.returns().size());
      stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
      for (auto& r : rets) stack->push_back(std::move(r));
    } else {
      op.callBoxed(stack);
    }
  }

  // 5. Wrap outputs.
  const size_t n_ret = schema.returns().size();
  const size_t rbegin = stack->size() - n_ret;
  size_t out_idx = 0;
  auto wrap = [&](const at::Tensor& local) -> at::Tensor {
    TORCH_INTERNAL_ASSERT(out_idx < sharding.outputs.size(), call.name, ": rule gave ", sharding.outputs.size(),
                          " outputs but the op returned more");
    const size_t k = out_idx++;
    if (!local.defined()) return local;
    if (sharding.output_shape_from_local)  // Replicate outputs: the local tensor is the global one
      return make_dtensor(local, DTensorSpec(*mesh, sharding.outputs[k],
                                             TensorMeta{local.sizes().vec(), local.strides().vec(), local.scalar_type()}));
    return make_dtensor(local, DTensorSpec(*mesh, sharding.outputs[k], sharding.output_meta[k]));
  };
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& v = (*stack)[rbegin + r];
    const auto& ai = schema.returns()[r].alias_info();
    if (v.isTensor()) {
      if (ai && ai->isWrite() && written.defined()) {
        ++out_idx;
        v = written;
      } else {
        v = wrap(v.toTensor());
      }
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> l;
      for (auto& t : v.toTensorVector()) l.push_back(wrap(t));
      v = l;
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor_fallback>()); }

}  // namespace dtensor
