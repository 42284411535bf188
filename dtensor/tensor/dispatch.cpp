// dtensor/tensor/dispatch.cpp: the boxed fallback behind kDTensorKey (DESIGN.md D1).
//
// NOTE: [DTensor fallback]
// Autograd has already recorded the op when we get here (the key is below it). Steps:
//   1. Read the schema's arguments off the stack; DTensors give specs, plain 0-dim tensors are
//      scalars, any other plain tensor is an error naming the op (or Replicate inside an
//      ImplicitReplicationGuard or a backward pass: NOTE: [Plain tensors made by backward
//      formulas]). Lists: a Tensor[] holds DTensors only (but see that NOTE); the indices of a
//      Tensor?[] (index, index_put) are arguments like any other (None entries stay None, and
//      a plain index tensor is replicated only inside the guard).
//   2. Propagate sharding (dtensor/ops): the cheapest strategy and the outputs' global metadata
//      (from a run on meta tensors, cached with the strategy).
//   3. Redistribute inputs to the strategy's placements and put the local tensors on the stack.
//   4. Run the op on local tensors, below this key and below autograd; a random op runs on
//      global stand-ins with the RNG tracker instead (NOTE: [Random ops on DTensors]), and a
//      rule with a local kernel runs that kernel instead (ops::LocalKernel). An in-place view
//      (squeeze_, ...) or an in-place indexing op that re-laid out its target updates the spec
//      of the DTensor it wrote (RuleOptions::inplace_view, relayout_written).
//   5. Wrap outputs as DTensors; in-place/out= returns give back the DTensor that was written.
//
// NOTE: [In-place writes through DTensor views]
// A view op on DTensors (slice, select, transpose, view...) runs on the local tensors, so its
// output's local tensor views the input's local tensor and in-place writes through the view
// reach the base, as on plain tensors: x.slice(1, 0, 2).fill_(0) on a row-sharded x works.
// When the strategy had to redistribute the input first (slicing the sharded dim, a view that
// merges a sharded dim behind another), the output views a redistributed COPY: it is marked
// (DTensorImpl::is_detached_view, inherited by views of it) and an in-place op that writes
// into it raises instead of losing the write. Autograd's CopySlices (in-place ops on views of
// tensors that require grad) rebuilds such writes with new_empty_strided + as_strided on the
// gradient, using the views' storage offsets: DTensors carry them (TensorMeta::storage_offset),
// and both ops keep that buffer replicated so that as_strided aliases it (view_rules.cpp,
// NOTE: [as_strided on DTensors]).
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
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <algorithm>
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

// How the output metadata of an op is inferred (NOTE: [DTensor fallback] step 2): on meta
// tensors, else on zero-filled CPU tensors, else on CPU tensors holding identity matrices (ones
// on the diagonal of the last two dims, ones for fewer dims): zero matrices are singular, and
// the ops without a meta kernel that refuse them (cholesky, cholesky_inverse in libtorch
// 1.13) take the identity.
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

// Tensor[] or Tensor?[].
bool is_tensor_list(const c10::IValue& v) { return v.isTensorList() || v.isOptionalTensorList(); }

// NOTE: [Plain tensors made by backward formulas]
// Some of libtorch's derivative formulas build a plain tensor from a DTensor's sizes and options
// and mix it with the DTensor gradient: mvlgamma_backward adds at::arange(p, options),
// slice_scatter's backward scatters zeros of src's saved TypeAndSize into the gradient,
// index_put's uses zeros_like(values), masked_scatter's and prod's (with a zero) cat a plain
// zeros / ones tensor with DTensors, as_strided_backward indexes with a plain arange. Those
// formulas are libtorch's, not ours, so the fallback decides instead: while the autograd engine
// runs a graph task on this thread, a plain tensor mixed with DTensors is treated as Replicate,
// exactly as inside an ImplicitReplicationGuard (Tensor[] elements included).
//   Why Replicate is exact there: a formula takes its sizes from the saved tensors and the
// gradient, or from constants (mvlgamma's arange has p elements and broadcasts), and a
// DTensor's sizes are its GLOBAL sizes (the wrapper's; autograd never sees a local shard), so
// the plain tensor is a whole global operand, never a piece of one; and the factories formulas
// use (zeros, ones, arange, zeros_like, new_zeros) are deterministic, so every rank builds the
// same value. Replicate with the tensor's own shape is then its exact placement, and the meta
// run of shape inference checks that shape against the DTensors' global ones. A plain tensor
// holding a LOCAL piece (which user code could pass) would be misread as global, and would
// slip through when its shape broadcasts: that is why the rule is scoped to backward, where
// the plain tensors are the formulas' own, and why outside backward the refusal is unchanged
// (forward code mixing plain tensors in still raises, under grad mode too).
//   Scope: the engine sets the thread's current graph task around each node it evaluates and
// around its final callbacks, so tensor hooks and custom Functions' backward bodies run inside
// it too and get the same treatment. Detection: torch::autograd::
// get_current_graph_task_exec_info() is non-null exactly then; it is exported with the same
// signature by libtorch 1.13 and 2.x (torch::autograd::get_current_node(), the anomaly-mode
// NodeGuard's node, is exported by 2.x only), so no compat shim is needed.
//   PyTorch's DTensor differs: its dispatcher replicates a plain tensor only when it has one
// element or inside implicit_replication() (_dispatch.py, _try_replicate_spec_for_scalar_tensor;
// else "got mixed torch.Tensor and DTensor"), and releases after 2.6 set a C++
// at::DTensorAllowImplicitReplication guard at individual ATen sites (one_hot, the embedding
// batch rule), not around backward; so there these formulas meet a plain tensor of more than
// one element and raise. We cannot patch libtorch's formulas site by site, and the engine tells
// us when we are in them.
bool in_autograd_backward() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

bool implicit_replication() { return ImplicitReplicationGuard::enabled() || in_autograd_backward(); }

// A copy of the list `v` (same element type) with element `pos` replaced: the caller's list
// must not change (it still holds the DTensors).
c10::IValue with_list_element(const c10::IValue& v, size_t pos, const at::Tensor& t) {
  c10::List<c10::IValue> in = v.toList();
  c10::impl::GenericList out(in.elementType());
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) out.push_back(i == pos ? c10::IValue(t) : in.get(i));
  return c10::IValue(std::move(out));
}

void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
}

// NOTE: [Loading into DTensors]
// torch::load(module, path) ends in libtorch's InputArchive::read, which calls
// `param.set_(loaded)` (no grad) for every parameter and buffer. For a DTensor parameter and a
// plain tensor of its global shape and dtype, that is "load the whole tensor into this
// DTensor": every rank read the same checkpoint, so each keeps its own piece (PyTorch's
// _shard_tensor: no communication) and the DTensor keeps its mesh and placements. Anything else
// raises, saying what would work. (Saving: NOTE: [Saving a DTensor] in dtensor_impl.cpp.)
bool load_whole_tensor(torch::jit::Stack* stack, size_t begin) {
  const at::Tensor self = (*stack)[begin].toTensor();
  const at::Tensor source = (*stack)[begin + 1].toTensor();
  if (!is_dtensor(self) || is_dtensor(source)) return false;
  auto* impl = unsafe_get_dtensor_impl(self);
  const DTensorSpec spec = impl->spec();
  TORCH_CHECK(source.sizes().vec() == spec.tensor_meta.shape && source.scalar_type() == spec.tensor_meta.dtype,
              "DTensor: set_ (torch::load into a module with DTensor parameters) got a plain ", source.scalar_type(),
              source.sizes(), " tensor for the DTensor ", spec.to_string(), " of ", spec.tensor_meta.dtype,
              c10::IntArrayRef(spec.tensor_meta.shape),
              ": torch::load can fill a DTensor only from the whole (unsharded) tensor of the same shape and "
              "dtype; load sharded checkpoints with dtensor::checkpoint::load");
  at::Tensor piece = local_tensor(_shard_tensor(source.detach(), spec.placements, spec.mesh));
  impl->set_local_and_spec(piece.is_contiguous() ? piece : piece.contiguous(), spec);
  torch::jit::drop(*stack, 2);
  stack->push_back(self);
  return true;
}

void dtensor_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  const size_t begin = stack->size() - n_args;
  if (schema.name() == "aten::set_" && schema.overload_name() == "source_Tensor" && load_whole_tensor(stack, begin))
    return;
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
  std::vector<std::pair<size_t, size_t>> plain_list_elements;  // (argument, position)
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
    } else if (is_tensor_list(v)) {
      // Tensor[] (cat, stack) or Tensor?[] (index, index_put: None entries stand for ':').
      const bool optional_list = v.isOptionalTensorList();
      c10::List<c10::IValue> l = v.toList();
      bool any_dtensor = false, any_plain = false;
      for (size_t p = 0; p < l.size(); ++p) {
        const c10::IValue e = l.get(p);
        if (!e.isTensor() || !e.toTensor().defined()) continue;
        (is_dtensor(e.toTensor()) ? any_dtensor : any_plain) = true;
      }
      if (!any_dtensor && !(optional_list && any_plain)) {
        a.value = v;
        continue;
      }
      a.kind = ops::ArgInfo::Kind::kDTensorList;
      a.list_size = static_cast<int64_t>(l.size());
      for (size_t p = 0; p < l.size(); ++p) {
        const c10::IValue e = l.get(p);
        if (!e.isTensor() || !e.toTensor().defined()) continue;  // a None of a Tensor?[]
        at::Tensor t = e.toTensor();
        if (!is_dtensor(t)) {
          // Indices of a Tensor?[] are arguments like any other: plain ones are replicated
          // inside an ImplicitReplicationGuard (the check is below, once the mesh is known).
          // Elements of a Tensor[] (cat, stack) only where implicit replication is on.
          TORCH_CHECK(optional_list || implicit_replication(), "DTensor: ", call.name,
                      " got a list mixing DTensors and plain tensors (element ", p,
                      "); distribute every tensor first, or run inside a dtensor::ImplicitReplicationGuard");
          plain_list_elements.push_back({i, p});
          continue;
        }
        a.list.push_back(adopt(t, i, static_cast<int64_t>(p)));
        a.list_index.push_back(static_cast<int64_t>(p));
      }
    } else {
      a.value = v;
    }
  }
  // NOTE: [Factories and the DTensor key]
  // A factory (zeros, arange, ...) has no tensor argument, so it reaches this fallback only when
  // a caller put the DTensor key in the thread's included keys; there is no mesh to build on.
  TORCH_CHECK(mesh.has_value(), "DTensor: ", call.name,
              " reached the DTensor fallback without a DTensor argument, so there is no mesh to create it on "
              "(was the DTensor dispatch key included with an IncludeDispatchKeyGuard?). Create sharded "
              "tensors with dtensor::zeros/ones/empty/full/arange(size, mesh, placements) or distribute_tensor");
  // NOTE: [Implicit replication of one-element tensors]
  // A plain tensor with ONE element (any number of dims: 0-dim ones stay plain arguments above)
  // has the same value on every rank by construction of any sane program, so it is treated as
  // Replicate without a guard, as PyTorch's dispatcher does (numel() == 1).
  auto replicated = [&](const at::Tensor& t, size_t arg_index) {
    TORCH_CHECK(implicit_replication() || t.numel() == 1, "DTensor: ", call.name, " got a plain tensor of shape ",
                t.sizes(), " as argument '", schema.arguments()[arg_index].name(), "' mixed with DTensors on ",
                mesh->to_string(),
                ". Distribute it (distribute_tensor / from_local) or run inside a "
                "dtensor::ImplicitReplicationGuard to treat it as replicated");
    return make_dtensor(t, DTensorSpec(*mesh, std::vector<Placement>(mesh->ndim(), Replicate{}),
                                       TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}));
  };
  for (size_t i : plain_args) {
    at::Tensor rep = replicated(call.args[i].value.toTensor(), i);
    (*stack)[begin + i] = rep;
    call.args[i].kind = ops::ArgInfo::Kind::kDTensor;
    call.args[i].spec = adopt(rep, i, -1);
    call.args[i].value = c10::IValue();
  }
  for (const auto& [i, p] : plain_list_elements) {
    c10::IValue& slot = (*stack)[begin + i];
    at::Tensor rep = replicated(slot.toList().get(p).toTensor(), i);
    slot = with_list_element(slot, p, rep);
    auto& a = call.args[i];
    // Keep list / list_index in list order.
    const auto at = std::lower_bound(a.list_index.begin(), a.list_index.end(), static_cast<int64_t>(p));
    const auto k = at - a.list_index.begin();
    a.list.insert(a.list.begin() + k, adopt(rep, i, static_cast<int64_t>(p)));
    a.list_index.insert(at, static_cast<int64_t>(p));
  }
  // Keep dargs in argument order (implicit replicas were appended last).
  std::stable_sort(dargs.begin(), dargs.end(), [](const DTensorArg& x, const DTensorArg& y) {
    return x.arg != y.arg ? x.arg < y.arg : x.list_pos < y.list_pos;
  });
  for (auto& d : dargs) call.inputs.push_back(&unsafe_get_dtensor_impl(d.dtensor)->spec());
  call.mesh = &*mesh;
  // The written arguments of in-place / out= ops: for each return, the schema argument it
  // aliases and writes (-1 for a return that writes nothing).
  std::vector<int> written_args;
  int written_arg = -1;  // the first one
  for (const auto& r : schema.returns()) {
    int w = -1;
    if (r.alias_info() && r.alias_info()->isWrite())
      for (size_t i = 0; i < n_args && w < 0; ++i) {
        const auto& ai = schema.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets()) w = static_cast<int>(i);
      }
    written_args.push_back(w);
    if (written_arg < 0) written_arg = w;
  }
  std::vector<bool> is_out_argument(n_args, false);
  for (size_t i : ops::out_arguments(schema)) is_out_argument[i] = true;
  // The DTensor passed as schema argument `arg` (undefined when it is not one).
  auto dtensor_arg = [&](int arg) {
    for (auto& d : dargs)
      if (static_cast<int>(d.arg) == arg && d.list_pos < 0) return d.dtensor;
    return at::Tensor();
  };
  // NOTE: [Out= overloads with several outputs] (sort.values, max.dim_max, _linalg_svd.U, ...):
  // propagation keeps each out= DTensor's placements and gives it the output of its position
  // (ops::out_inputs); each is written in place and returned, as PyTorch's DTensor does.
  // call.written_input names the first written DTensor (in-place ops write one).
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
    auto run_on = [&](StandIn kind) {
      torch::jit::Stack ms(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
      auto stand_in = [&](const DTensorSpec& s) { return stand_in_for(s, kind); };
      for (size_t i = 0; i < n_args; ++i) {
        auto& a = call.args[i];
        if (a.kind == ops::ArgInfo::Kind::kDTensor) ms[i] = stand_in(*a.spec);
        else if (a.kind == ops::ArgInfo::Kind::kDTensorList) {
          for (size_t k = 0; k < a.list.size(); ++k)
            ms[i] = with_list_element(ms[i], static_cast<size_t>(a.list_index[k]), stand_in(a.list[k]));
        }
        // Inferring shapes must not draw from the caller's generator (or the default one).
        const auto& type = schema.arguments()[i].type();
        if (ms[i].isGenerator() || (ms[i].isNone() && type->kind() == c10::TypeKind::OptionalType &&
                                    type->expectRef<c10::OptionalType>().getElementType()->kind() ==
                                        c10::TypeKind::GeneratorType))
          ms[i] = at::detail::createCPUGenerator();
      }
      // NOTE: libtorch 1.13's boxed wrapper of a kernel returning several references (out=
      // overloads with several outputs: std::tuple<Tensor&, Tensor&>) drops the arguments from
      // the stack and then copies its returns from the dropped slots: the stand-ins must stay
      // alive elsewhere, or the copies read freed tensors (heap corruption).
      const torch::jit::Stack keep_alive = ms;
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
        ms = run_on(StandIn::kMeta);
        have_meta = true;
      } catch (const c10::Error&) {
        std::lock_guard<std::mutex> lk(no_meta_mu);
        no_meta.insert(call.name);
      }
    }
    if (!have_meta) {
      try {
        ms = run_on(StandIn::kZeros);
      } catch (const c10::Error& e) {
        try {
          ms = run_on(StandIn::kIdentity);
        } catch (const c10::Error&) {
          TORCH_CHECK(false, "DTensor: computing the output shape of ", call.name, " failed: ",
                      e.what_without_backtrace());
        }
      }
    }
    std::vector<at::Tensor> outs;
    for (auto& v : ms) collect_tensors(v, outs);
    for (auto& t : outs)
      metas.push_back(t.defined() ? TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.storage_offset()}
                                  : TensorMeta{});
    return metas;
  };
  // NOTE: [In-place ops of backward formulas on Partial buffers]
  // An in-place op keeps the placements of the tensor it writes, and a non-linear one (digamma_,
  // ...) has no strategy for a Partial target, so it raises (as PyTorch's DTensor does). Backward
  // formulas do write in place into buffers they just made: mvlgamma_backward computes
  // (self.unsqueeze(-1) + arange).digamma_(), and with a Partial self (the saved input) the sum
  // is Partial. So inside a backward pass (NOTE: [Plain tensors made by backward formulas]),
  // when propagation refuses an in-place op (not out=) whose target is Partial and nothing else
  // aliases it (its shard's storage is its own: no view of it, not a view of anything), the
  // target is reduced in place to Replicate on those mesh dims (the DTensor takes the new shard
  // and spec: same global value, every handle of it sees it) and propagation runs again. A
  // target that is aliased keeps the refusal: a view would no longer see the write.
  auto reduce_partial_target = [&]() -> bool {
    if (call.written_input < 0 || is_out_argument[static_cast<size_t>(written_arg)] || !in_autograd_backward())
      return false;
    auto* impl = unsafe_get_dtensor_impl(dargs[static_cast<size_t>(call.written_input)].dtensor);
    const DTensorSpec& from = impl->spec();
    std::vector<Placement> to = from.placements;
    bool partial = false;
    for (auto& p : to)
      if (is_partial(p)) {
        p = Replicate{};
        partial = true;
      }
    if (!partial || impl->is_detached_view() || !impl->local().has_storage() ||
        impl->local().storage().use_count() != 1)
      return false;
    at::Tensor local = detail::redistribute_local(impl->local(), from, to);
    impl->set_local_and_spec(std::move(local), DTensorSpec(from.mesh, to, from.tensor_meta));
    return true;
  };
  ops::OutputSharding sharding;
  try {
    sharding = ops::propagate(call, infer_meta);
  } catch (const c10::Error&) {
    if (!reduce_partial_target()) throw;
    sharding = ops::propagate(call, infer_meta);
  }
  call.output_meta = sharding.output_meta;  // on a cache hit, propagate did not infer them
  if (sharding.replicate_fallback) ops::note_replicate_fallback_use();

  // NOTE: [In-place writes through DTensor views] (checked before any communication: the
  // flag and the strategy are the same on every rank).
  for (int arg : written_args) {
    const at::Tensor written_dt = arg >= 0 && !sharding.inplace_view ? dtensor_arg(arg) : at::Tensor();
    if (!written_dt.defined()) continue;
    const auto* w = unsafe_get_dtensor_impl(written_dt);
    TORCH_CHECK(!w->is_detached_view(), "DTensor: ", call.name, " writes into a view of a DTensor (placements ",
                to_string(w->spec().placements), ", shape ", c10::IntArrayRef(w->spec().tensor_meta.shape),
                ") that does not share memory with the tensor it was taken from: the view op had to redistribute "
                "its input, so the write would not reach that tensor. Redistribute the tensor so that the view "
                "keeps its layout (e.g. replicate the dim being sliced) before taking the view, or clone() the "
                "view to write into a copy");
  }

  // NOTE: [Ranks outside the mesh] (api.cpp): a rank outside the mesh runs nothing and
  // communicates nothing; as PyTorch's dispatcher, it returns empty locals (a 0-dim result
  // gets a 0-dim zero, others shape [0]) with the propagated placements and global shapes,
  // the written DTensor of an in-place op as is, and `true` for aten::equal.
  if (!mesh->get_coordinate().has_value()) {
    const auto& returns = schema.returns();
    size_t single_tensors = 0, lists = 0;
    for (const auto& r : returns) {
      if (r.type()->kind() == c10::TypeKind::TensorType) ++single_tensors;
      else if (r.type()->kind() == c10::TypeKind::ListType) ++lists;
    }
    size_t k = 0;
    auto empty_output = [&]() -> at::Tensor {
      TORCH_INTERNAL_ASSERT(k < sharding.outputs.size() && k < sharding.output_meta.size(), call.name,
                            ": fewer output specs than outputs");
      const TensorMeta& m = sharding.output_meta[k];
      at::Tensor local = m.shape.empty() ? at::zeros({}, at::TensorOptions().dtype(m.dtype).device(mesh->device()))
                                         : at::empty({0}, at::TensorOptions().dtype(m.dtype).device(mesh->device()));
      return make_dtensor(local, DTensorSpec(*mesh, sharding.outputs[k++], m));
    };
    std::vector<c10::IValue> rets;
    for (size_t ri = 0; ri < returns.size(); ++ri) {
      const auto& r = returns[ri];
      const auto kind = r.type()->kind();
      if (kind == c10::TypeKind::TensorType) {
        const at::Tensor written_dt = dtensor_arg(written_args[ri]);
        if (written_dt.defined()) {
          ++k;
          rets.emplace_back(written_dt);
        } else {
          rets.emplace_back(empty_output());
        }
      } else if (kind == c10::TypeKind::ListType && lists == 1) {
        std::vector<at::Tensor> l;
        const size_t n = sharding.outputs.size() - single_tensors;
        for (size_t j = 0; j < n; ++j) l.push_back(empty_output());
        rets.emplace_back(l);
      } else if (call.name == "aten::equal" && kind == c10::TypeKind::BoolType) {
        rets.emplace_back(true);
      } else {
        TORCH_CHECK(false, "DTensor: ", call.name, " on rank ", mesh->get_rank(), ", which is not in ",
                    mesh->to_string(), ": the op returns a ", r.type()->str(),
                    " that a rank outside the mesh cannot compute; call it on the ranks of the mesh only");
      }
    }
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
    for (auto& v : rets) stack->push_back(std::move(v));
    return;
  }

  // 3. Redistribute inputs; local tensors onto the stack.
  at::Tensor relaid_written_local;  // NOTE: [In-place indexing may re-lay out what it writes]
  std::vector<bool> redistributed_arg(n_args, false);
  for (size_t k = 0; k < dargs.size(); ++k) {
    auto* impl = unsafe_get_dtensor_impl(dargs[k].dtensor);
    at::Tensor local = impl->local();
    if (!(impl->spec().placements == sharding.inputs[k])) {
      local = detail::redistribute_local(local, impl->spec(), sharding.inputs[k]);
      redistributed_arg[dargs[k].arg] = true;
      if (static_cast<int>(k) == call.written_input) relaid_written_local = local;
    }
    if (impl->is_detached_view()) redistributed_arg[dargs[k].arg] = true;  // views of it are detached too
    c10::IValue& slot = (*stack)[begin + dargs[k].arg];
    if (dargs[k].list_pos < 0) {
      slot = local;
    } else {
      slot = with_list_element(slot, static_cast<size_t>(dargs[k].list_pos), local);
    }
  }
  const at::Tensor written = dtensor_arg(written_arg);
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
  // An in-place view changed the shape of the local tensor it was given (the written DTensor's
  // own local: in-place ops never redistribute what they write): the DTensor follows.
  if (sharding.inplace_view && written.defined()) {
    auto* impl = unsafe_get_dtensor_impl(written);
    impl->set_local_and_spec(impl->local(), DTensorSpec(*mesh, sharding.outputs[0], sharding.output_meta[0]));
  }
  // The op wrote into a redistributed copy of the written DTensor's shard: the DTensor takes it.
  if (relaid_written_local.defined()) {
    TORCH_INTERNAL_ASSERT(sharding.relayout_written && written.defined(), call.name,
                          ": redistributed the tensor it writes without RuleOptions::relayout_written");
    unsafe_get_dtensor_impl(written)->set_local_and_spec(
        relaid_written_local, DTensorSpec(*mesh, sharding.outputs[0], sharding.output_meta[0]));
  }

  // 5. Wrap outputs.
  const size_t n_ret = schema.returns().size();
  const size_t rbegin = stack->size() - n_ret;
  size_t out_idx = 0;
  auto wrap = [&](const at::Tensor& local, bool detached_view) -> at::Tensor {
    TORCH_INTERNAL_ASSERT(out_idx < sharding.outputs.size(), call.name, ": rule gave ", sharding.outputs.size(),
                          " outputs but the op returned more");
    const size_t k = out_idx++;
    if (!local.defined()) return local;
    at::Tensor out =
        sharding.output_shape_from_local  // Replicate outputs: the local tensor is the global one
            ? make_dtensor(local, DTensorSpec(*mesh, sharding.outputs[k],
                                              TensorMeta{local.sizes().vec(), local.strides().vec(), local.scalar_type()}))
            : make_dtensor(local, DTensorSpec(*mesh, sharding.outputs[k], sharding.output_meta[k]));
    if (detached_view) unsafe_get_dtensor_impl(out)->set_detached_view(true);
    return out;
  };
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& v = (*stack)[rbegin + r];
    const auto& ai = schema.returns()[r].alias_info();
    // A view (the return aliases an argument without writing it) of a redistributed input.
    bool detached_view = false;
    if (ai && !ai->isWrite())
      for (size_t i = 0; i < n_args; ++i) {
        const auto& arg_ai = schema.arguments()[i].alias_info();
        if (arg_ai && arg_ai->beforeSets() == ai->beforeSets() && redistributed_arg[i]) detached_view = true;
      }
    const at::Tensor written_dt = dtensor_arg(written_args[r]);
    if (v.isTensor()) {
      if (written_dt.defined()) {
        // An out= tensor of another shape was resized by the op: its spec follows (PyTorch sets
        // the out= DTensor's spec to the output spec); in-place ops keep their shapes.
        const size_t k = out_idx++;
        auto* impl = unsafe_get_dtensor_impl(written_dt);
        if (is_out_argument[static_cast<size_t>(written_args[r])] && !sharding.output_shape_from_local &&
            k < sharding.output_meta.size() &&
            impl->spec().tensor_meta.shape != sharding.output_meta[k].shape)
          impl->set_local_and_spec(impl->local(), DTensorSpec(*mesh, sharding.outputs[k], sharding.output_meta[k]));
        v = written_dt;
      } else {
        v = wrap(v.toTensor(), detached_view);
      }
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> l;
      for (auto& t : v.toTensorVector()) l.push_back(wrap(t, detached_view));
      v = l;
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor_fallback>()); }

}  // namespace dtensor
