// dtensor/tensor/dispatch.cpp: the boxed fallback behind kDTensorKey (DESIGN.md D1).
//
// NOTE: [DTensor fallback]
// Autograd has already recorded the op when we get here (the key is below it). An op with a
// handler of its own in scope on this thread goes to it (op_handlers_internal.h: loss_parallel()).
// Otherwise the fallback runs these stages, each a function below (FallbackCall holds what they
// share):
//   1. collect_arguments: the schema's arguments off the stack; DTensors give specs, plain
//      0-dim tensors are scalars, any other plain tensor is an error naming the op (or
//      Replicate inside an ImplicitReplicationGuard or a backward pass: NOTE: [Plain tensors
//      made by backward formulas]). Lists: a Tensor[] holds DTensors only (but see that NOTE);
//      the indices of a Tensor?[] (index, index_put) are arguments like any other (None
//      entries stay None, and a plain index tensor is replicated only inside the guard).
//   2. replicate_plain_tensors: those plain tensors become Replicate DTensors.
//   3. find_written_arguments: what in-place and out= ops write.
//   4. propagate (dtensor/ops): the cheapest strategy and the outputs' global metadata (NOTE:
//      [Output metadata without the data], cached with the strategy); a Partial target of an
//      in-place op in backward is reduced first when that is what stood in the way.
//   5. check_writes_reach_their_tensor: NOTE: [In-place writes through DTensor views].
//   6. return_outside_the_mesh on a rank outside the mesh; else redistribute_inputs to the
//      strategy's placements, their local tensors onto the stack.
//   7. run_locally: the op on local tensors, below this key and below autograd; a random op
//      runs on global stand-ins with the RNG tracker instead (NOTE: [Random ops on DTensors]),
//      and a rule with a local kernel runs that kernel instead (ops::LocalKernel).
//   8. update_written_dtensor: an in-place view (squeeze_, ...) or an in-place indexing op
//      that re-laid out its target updates the spec of the DTensor it wrote
//      (RuleOptions::inplace_view, relayout_written).
//   9. wrap_outputs as DTensors; in-place/out= returns give back the DTensor that was written.
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
#include "dtensor/debug/comm_mode_internal.h"
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/tensor/op_handlers_internal.h"
#include "dtensor/tensor/output_meta_internal.h"
#include "dtensor/tensor/random.h"
#include "dtensor/tensor/redistribute.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

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

// One call of the fallback: what its stages read and write (NOTE: [DTensor fallback]).
struct FallbackCall {
  FallbackCall(const c10::OperatorHandle& o, torch::jit::Stack* s)
      : op(o), schema(o.schema()), stack(s), n_args(schema.arguments().size()), begin(s->size() - n_args) {
    call.name = op_name(schema);
    call.schema = &schema;
    call.args.resize(n_args);
  }
  const c10::OperatorHandle& op;
  const c10::FunctionSchema& schema;
  torch::jit::Stack* stack;
  const size_t n_args;
  const size_t begin;  // the op's first argument on the stack
  ops::OpCall call;
  std::vector<DTensorArg> dargs;  // in argument order once the arguments are collected
  std::optional<DeviceMesh> mesh;
  // Plain tensors mixed with DTensors: arguments, and (argument, position) list elements.
  std::vector<size_t> plain_args;
  std::vector<std::pair<size_t, size_t>> plain_list_elements;
  // For each return, the schema argument it aliases and writes (-1: none); the first of them.
  std::vector<int> written_args;
  int written_arg = -1;
  std::vector<bool> is_out_argument;
  ops::OutputSharding sharding;
  std::vector<bool> redistributed_arg;  // the argument's local is a redistributed copy
  at::Tensor relaid_written_local;      // NOTE: [In-place indexing may re-lay out what it writes]

  c10::IValue& arg(size_t i) { return (*stack)[begin + i]; }
  torch::jit::Stack arguments() const {
    return torch::jit::Stack(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  }
  // Replaces the op's arguments (or its returns) on the stack by `values`.
  void replace_top(size_t from, std::vector<c10::IValue> values) {
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(from), stack->end());
    for (auto& v : values) stack->push_back(std::move(v));
  }
  // The DTensor passed as schema argument `a` (undefined when it is not one).
  at::Tensor dtensor_arg(int a) const {
    for (const auto& d : dargs)
      if (static_cast<int>(d.arg) == a && d.list_pos < 0) return d.dtensor;
    return at::Tensor();
  }
  // Records DTensor `t` as argument `i` (list position `pos`, -1 for none); its spec.
  const DTensorSpec& adopt(const at::Tensor& t, size_t i, int64_t pos) {
    auto* impl = maybe_get_dtensor_impl(t);
    if (!mesh) mesh = impl->spec().mesh;
    TORCH_CHECK(*mesh == impl->spec().mesh, "DTensor: ", call.name, " got DTensors on different meshes: ",
                mesh->to_string(), " and ", impl->spec().mesh.to_string());
    dargs.push_back({i, pos, t});
    return impl->spec();
  }
};

// Stage 1a: a Tensor[] (cat, stack) or Tensor?[] (index, index_put: None entries stand for ':').
void collect_list_argument(FallbackCall& f, size_t i) {
  const c10::IValue& v = f.arg(i);
  auto& a = f.call.args[i];
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
    return;
  }
  a.kind = ops::ArgInfo::Kind::kDTensorList;
  a.list_size = static_cast<int64_t>(l.size());
  for (size_t p = 0; p < l.size(); ++p) {
    const c10::IValue e = l.get(p);
    if (!e.isTensor() || !e.toTensor().defined()) continue;  // a None of a Tensor?[]
    at::Tensor t = e.toTensor();
    if (!is_dtensor(t)) {
      // Indices of a Tensor?[] are arguments like any other: plain ones are replicated
      // inside an ImplicitReplicationGuard (checked once the mesh is known). Elements of a
      // Tensor[] (cat, stack) only where implicit replication is on.
      TORCH_CHECK(optional_list || implicit_replication(), "DTensor: ", f.call.name,
                  " got a list mixing DTensors and plain tensors (element ", p,
                  "); distribute every tensor first, or run inside a dtensor::ImplicitReplicationGuard");
      f.plain_list_elements.push_back({i, p});
      continue;
    }
    a.list.push_back(f.adopt(t, i, static_cast<int64_t>(p)));
    a.list_index.push_back(static_cast<int64_t>(p));
  }
}

// Stage 1: the schema's arguments: DTensors give specs, plain 0-dim tensors are scalars, other
// plain tensors are noted for stage 2.
void collect_arguments(FallbackCall& f) {
  for (size_t i = 0; i < f.n_args; ++i) {
    c10::IValue& v = f.arg(i);
    auto& a = f.call.args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (is_dtensor(t)) {
        a.kind = ops::ArgInfo::Kind::kDTensor;
        a.spec = f.adopt(t, i, -1);
      } else {
        a.value = v;
        if (t.defined() && t.dim() > 0) f.plain_args.push_back(i);
      }
    } else if (is_tensor_list(v)) {
      collect_list_argument(f, i);
    } else {
      a.value = v;
    }
  }
  // NOTE: [Factories and the DTensor key]
  // A factory (zeros, arange, ...) has no tensor argument, so it reaches this fallback only when
  // a caller put the DTensor key in the thread's included keys; there is no mesh to build on.
  TORCH_CHECK(f.mesh.has_value(), "DTensor: ", f.call.name,
              " reached the DTensor fallback without a DTensor argument, so there is no mesh to create it on "
              "(was the DTensor dispatch key included with an IncludeDispatchKeyGuard?). Create sharded "
              "tensors with dtensor::zeros/ones/empty/full/arange(size, mesh, placements) or distribute_tensor");
}

// NOTE: [Implicit replication of one-element tensors]
// A plain tensor with ONE element (any number of dims: 0-dim ones stay plain arguments) has
// the same value on every rank by construction of any sane program, so it is treated as
// Replicate without a guard, as PyTorch's dispatcher does (numel() == 1).
at::Tensor replicated(const FallbackCall& f, const at::Tensor& t, size_t arg_index) {
  TORCH_CHECK(implicit_replication() || t.numel() == 1, "DTensor: ", f.call.name, " got a plain tensor of shape ",
              t.sizes(), " as argument '", f.schema.arguments()[arg_index].name(), "' mixed with DTensors on ",
              f.mesh->to_string(),
              ". Distribute it (distribute_tensor / from_local) or run inside a "
              "dtensor::ImplicitReplicationGuard to treat it as replicated");
  return make_dtensor(t, DTensorSpec(*f.mesh, std::vector<Placement>(f.mesh->ndim(), Replicate{}),
                                     TensorMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}));
}

// Stage 2: plain tensors mixed with DTensors become Replicate DTensors (or raise); the DTensor
// inputs are then listed in argument order.
void replicate_plain_tensors(FallbackCall& f) {
  for (size_t i : f.plain_args) {
    at::Tensor rep = replicated(f, f.call.args[i].value.toTensor(), i);
    f.arg(i) = rep;
    auto& a = f.call.args[i];
    a.kind = ops::ArgInfo::Kind::kDTensor;
    a.spec = f.adopt(rep, i, -1);
    a.value = c10::IValue();
  }
  for (const auto& [i, p] : f.plain_list_elements) {
    c10::IValue& slot = f.arg(i);
    at::Tensor rep = replicated(f, slot.toList().get(p).toTensor(), i);
    slot = detail::with_list_element(slot, p, rep);
    auto& a = f.call.args[i];
    // Keep list / list_index in list order.
    const auto at = std::lower_bound(a.list_index.begin(), a.list_index.end(), static_cast<int64_t>(p));
    const auto k = at - a.list_index.begin();
    a.list.insert(a.list.begin() + k, f.adopt(rep, i, static_cast<int64_t>(p)));
    a.list_index.insert(at, static_cast<int64_t>(p));
  }
  // Keep dargs in argument order (implicit replicas were appended last).
  std::stable_sort(f.dargs.begin(), f.dargs.end(), [](const DTensorArg& x, const DTensorArg& y) {
    return x.arg != y.arg ? x.arg < y.arg : x.list_pos < y.list_pos;
  });
  for (auto& d : f.dargs) f.call.inputs.push_back(&unsafe_get_dtensor_impl(d.dtensor)->spec());
  f.call.mesh = &*f.mesh;
}

// Stage 3: the arguments that in-place and out= ops write.
void find_written_arguments(FallbackCall& f) {
  for (const auto& r : f.schema.returns()) {
    int w = -1;
    if (r.alias_info() && r.alias_info()->isWrite())
      for (size_t i = 0; i < f.n_args && w < 0; ++i) {
        const auto& ai = f.schema.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets()) w = static_cast<int>(i);
      }
    f.written_args.push_back(w);
    if (f.written_arg < 0) f.written_arg = w;
  }
  f.is_out_argument.assign(f.n_args, false);
  for (size_t i : ops::out_arguments(f.schema)) f.is_out_argument[i] = true;
  // NOTE: [Out= overloads with several outputs] (sort.values, max.dim_max, _linalg_svd.U, ...):
  // propagation keeps each out= DTensor's placements and gives it the output of its position
  // (ops::out_inputs); each is written in place and returned, as PyTorch's DTensor does.
  // call.written_input names the first written DTensor (in-place ops write one).
  for (size_t k = 0; k < f.dargs.size(); ++k)
    if (static_cast<int>(f.dargs[k].arg) == f.written_arg && f.dargs[k].list_pos < 0)
      f.call.written_input = static_cast<int>(k);
  // A plain tensor written in place (result.scatter_add_(dim, index, grad) in cummax's backward
  // formula): the write must land in that tensor's own storage.
  f.call.written_keeps_layout =
      f.written_arg >= 0 && std::find(f.plain_args.begin(), f.plain_args.end(), static_cast<size_t>(f.written_arg)) !=
                                f.plain_args.end();
  // NOTE: [In-place list ops]
  // _foreach_add_(Tensor(a!)[] self, ...) -> () writes the elements of `self` and returns
  // nothing. Propagation keeps each element's placements (so the op runs on the DTensors' own
  // local tensors and the writes land in them), and a detached view among them is refused
  // (check_writes_reach_their_tensor).
  for (size_t k = 0; k < f.dargs.size(); ++k) {
    const auto& ai = f.schema.arguments()[f.dargs[k].arg].alias_info();
    if (f.dargs[k].list_pos >= 0 && ai && ai->isWrite()) f.call.written_list_inputs.push_back(k);
  }
}

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
bool reduce_partial_target(FallbackCall& f) {
  if (f.call.written_input < 0 || f.is_out_argument[static_cast<size_t>(f.written_arg)] || !in_autograd_backward())
    return false;
  auto* impl = unsafe_get_dtensor_impl(f.dargs[static_cast<size_t>(f.call.written_input)].dtensor);
  const DTensorSpec& from = impl->spec();
  std::vector<Placement> to = from.placements;
  bool partial = false;
  for (auto& p : to)
    if (is_partial(p)) {
      p = Replicate{};
      partial = true;
    }
  if (!partial || impl->is_detached_view() || !impl->local().has_storage() || impl->local().storage().use_count() != 1)
    return false;
  debug::detail::check_implicit_redistribution(f.call.name, static_cast<int>(f.written_arg), from.placements, to,
                                               from.mesh);
  const debug::detail::CollectiveCause why(f.call.name, static_cast<int>(f.written_arg), from.placements, to,
                                           from.mesh);
  at::Tensor local = detail::redistribute_local(impl->local(), from, to);
  impl->set_local_and_spec(std::move(local), DTensorSpec(from.mesh, to, from.tensor_meta));
  return true;
}

// Stage 4: the cheapest strategy, and the outputs' global metadata (NOTE: [Output metadata
// without the data]; on a cache hit, propagate does not infer them).
void propagate(FallbackCall& f) {
  auto infer_meta = [&f] { return detail::infer_output_meta(f.op, f.arguments(), f.call); };
  try {
    f.sharding = ops::propagate(f.call, infer_meta);
  } catch (const c10::Error&) {
    if (!reduce_partial_target(f)) throw;
    f.sharding = ops::propagate(f.call, infer_meta);
  }
  f.call.output_meta = f.sharding.output_meta;
  if (f.sharding.replicate_fallback) ops::note_replicate_fallback_use();
}

// Stage 5: NOTE: [In-place writes through DTensor views] (checked before any communication:
// the flag and the strategy are the same on every rank).
void check_writes_reach_their_tensor(const FallbackCall& f) {
  std::vector<at::Tensor> written;
  for (int a : f.written_args)
    if (a >= 0 && !f.sharding.inplace_view) written.push_back(f.dtensor_arg(a));
  for (size_t k : f.call.written_list_inputs) written.push_back(f.dargs[k].dtensor);  // NOTE: [In-place list ops]
  for (const at::Tensor& written_dt : written) {
    if (!written_dt.defined()) continue;
    const auto* w = unsafe_get_dtensor_impl(written_dt);
    TORCH_CHECK(!w->is_detached_view(), "DTensor: ", f.call.name, " writes into a view of a DTensor (placements ",
                to_string(w->spec().placements), ", shape ", c10::IntArrayRef(w->spec().tensor_meta.shape),
                ") that does not share memory with the tensor it was taken from: the view op had to redistribute "
                "its input, so the write would not reach that tensor. Redistribute the tensor so that the view "
                "keeps its layout (e.g. replicate the dim being sliced) before taking the view, or clone() the "
                "view to write into a copy");
  }
}

// Stage 6 (a rank outside the mesh): NOTE: [Ranks outside the mesh] (api.cpp): such a rank runs
// nothing and communicates nothing; as PyTorch's dispatcher, it returns empty locals (a 0-dim
// result gets a 0-dim zero, others shape [0]) with the propagated placements and global
// shapes, the written DTensor of an in-place op as is, and `true` for aten::equal.
void return_outside_the_mesh(FallbackCall& f) {
  const auto& returns = f.schema.returns();
  size_t single_tensors = 0, lists = 0;
  for (const auto& r : returns) {
    if (r.type()->kind() == c10::TypeKind::TensorType) ++single_tensors;
    else if (r.type()->kind() == c10::TypeKind::ListType) ++lists;
  }
  const auto& sharding = f.sharding;
  size_t k = 0;
  auto empty_output = [&]() -> at::Tensor {
    TORCH_INTERNAL_ASSERT(k < sharding.outputs.size() && k < sharding.output_meta.size(), f.call.name,
                          ": fewer output specs than outputs");
    const TensorMeta& m = sharding.output_meta[k];
    const auto options = at::TensorOptions().dtype(m.dtype).device(f.mesh->device());
    at::Tensor local = m.shape.empty() ? at::zeros({}, options) : at::empty({0}, options);
    return make_dtensor(local, DTensorSpec(*f.mesh, sharding.outputs[k++], m));
  };
  std::vector<c10::IValue> rets;
  for (size_t ri = 0; ri < returns.size(); ++ri) {
    const auto kind = returns[ri].type()->kind();
    if (kind == c10::TypeKind::TensorType) {
      const at::Tensor written_dt = f.dtensor_arg(f.written_args[ri]);
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
    } else if (f.call.name == "aten::equal" && kind == c10::TypeKind::BoolType) {
      rets.emplace_back(true);
    } else {
      TORCH_CHECK(false, "DTensor: ", f.call.name, " on rank ", f.mesh->get_rank(), ", which is not in ",
                  f.mesh->to_string(), ": the op returns a ", returns[ri].type()->str(),
                  " that a rank outside the mesh cannot compute; call it on the ranks of the mesh only");
    }
  }
  f.replace_top(f.begin, std::move(rets));
}

// Stage 6: inputs redistributed to the strategy's placements, their locals onto the stack.
void redistribute_inputs(FallbackCall& f) {
  f.redistributed_arg.assign(f.n_args, false);
  if (debug::detail::recording()) {  // a strict CommDebugMode refuses before anything moves
    for (size_t k = 0; k < f.dargs.size(); ++k) {
      const DTensorSpec& spec = unsafe_get_dtensor_impl(f.dargs[k].dtensor)->spec();
      if (!(spec.placements == f.sharding.inputs[k]))
        debug::detail::check_implicit_redistribution(f.call.name, static_cast<int>(f.dargs[k].arg), spec.placements,
                                                     f.sharding.inputs[k], spec.mesh);
    }
  }
  for (size_t k = 0; k < f.dargs.size(); ++k) {
    auto* impl = unsafe_get_dtensor_impl(f.dargs[k].dtensor);
    at::Tensor local = impl->local();
    if (!(impl->spec().placements == f.sharding.inputs[k])) {
      const debug::detail::CollectiveCause why(f.call.name, static_cast<int>(f.dargs[k].arg), impl->spec().placements,
                                               f.sharding.inputs[k], impl->spec().mesh);
      local = detail::redistribute_local(local, impl->spec(), f.sharding.inputs[k]);
      f.redistributed_arg[f.dargs[k].arg] = true;
      if (static_cast<int>(k) == f.call.written_input) f.relaid_written_local = local;
    }
    if (impl->is_detached_view()) f.redistributed_arg[f.dargs[k].arg] = true;  // views of it are detached too
    c10::IValue& slot = f.arg(f.dargs[k].arg);
    if (f.dargs[k].list_pos < 0) slot = local;
    else slot = detail::with_list_element(slot, static_cast<size_t>(f.dargs[k].list_pos), local);
  }
  if (f.sharding.rewrite) {
    std::vector<c10::IValue> args = f.arguments();
    f.sharding.rewrite(args, f.call, f.sharding.outputs);
    for (size_t i = 0; i < f.n_args; ++i) f.arg(i) = std::move(args[i]);
  }
}

// Stage 7: the op on the local tensors, below this key and below autograd (a random op: NOTE:
// [Random ops on DTensors]; a rule's local kernel: ops::LocalKernel).
void run_locally(FallbackCall& f) {
  c10::impl::ExcludeDispatchKeyGuard no_dtensor(kDTensorKey);
  at::AutoDispatchBelowADInplaceOrView below;
  if (f.sharding.random) {
    std::vector<detail::RandomOpInput> random_inputs;
    for (size_t k = 0; k < f.dargs.size(); ++k)
      random_inputs.push_back(
          {f.dargs[k].arg, f.dargs[k].list_pos, f.sharding.inputs[k], &f.call.inputs[k]->tensor_meta});
    detail::run_random_op(f.op, f.stack, f.begin, *f.mesh, random_inputs, f.sharding.outputs, f.written_arg);
  } else if (f.sharding.kernel) {
    std::vector<c10::IValue> args = f.arguments();
    std::vector<c10::IValue> rets = f.sharding.kernel(f.op, args, f.call, f.sharding);
    TORCH_INTERNAL_ASSERT(rets.size() == f.schema.returns().size(), "the local kernel of ", f.call.name, " returned ",
                          rets.size(), " values; the op returns ", f.schema.returns().size());
    f.replace_top(f.begin, std::move(rets));
  } else {
    f.op.callBoxed(f.stack);
  }
}

// Stage 8: the written DTensor follows what the local op did to its local tensor.
void update_written_dtensor(FallbackCall& f) {
  const at::Tensor written = f.dtensor_arg(f.written_arg);
  // An in-place view changed the shape of the local tensor it was given (the written DTensor's
  // own local: in-place ops never redistribute what they write).
  if (f.sharding.inplace_view && written.defined()) {
    auto* impl = unsafe_get_dtensor_impl(written);
    impl->set_local_and_spec(impl->local(), DTensorSpec(*f.mesh, f.sharding.outputs[0], f.sharding.output_meta[0]));
  }
  // The op wrote into a redistributed copy of the written DTensor's shard: the DTensor takes it.
  if (f.relaid_written_local.defined()) {
    TORCH_INTERNAL_ASSERT(f.sharding.relayout_written && written.defined(), f.call.name,
                          ": redistributed the tensor it writes without RuleOptions::relayout_written");
    unsafe_get_dtensor_impl(written)->set_local_and_spec(
        f.relaid_written_local, DTensorSpec(*f.mesh, f.sharding.outputs[0], f.sharding.output_meta[0]));
  }
}

// A view (return `r` aliases an argument without writing it) of a redistributed input.
bool returns_detached_view(const FallbackCall& f, size_t r) {
  const auto& ai = f.schema.returns()[r].alias_info();
  if (!ai || ai->isWrite()) return false;
  for (size_t i = 0; i < f.n_args; ++i) {
    const auto& arg_ai = f.schema.arguments()[i].alias_info();
    if (arg_ai && arg_ai->beforeSets() == ai->beforeSets() && f.redistributed_arg[i]) return true;
  }
  return false;
}

// Local output `local` as the DTensor of output `k`.
at::Tensor wrap_output(const FallbackCall& f, size_t k, const at::Tensor& local, bool detached_view) {
  TORCH_INTERNAL_ASSERT(k < f.sharding.outputs.size(), f.call.name, ": rule gave ", f.sharding.outputs.size(),
                        " outputs but the op returned more");
  if (!local.defined()) return local;
  const TensorMeta meta = f.sharding.output_shape_from_local  // Replicate outputs: the local is the global
                              ? TensorMeta{local.sizes().vec(), local.strides().vec(), local.scalar_type()}
                              : f.sharding.output_meta[k];
  at::Tensor out = make_dtensor(local, DTensorSpec(*f.mesh, f.sharding.outputs[k], meta));
  if (detached_view) unsafe_get_dtensor_impl(out)->set_detached_view(true);
  return out;
}

// Stage 9: outputs wrapped as DTensors; in-place/out= returns give back the DTensor written.
void wrap_outputs(FallbackCall& f) {
  const size_t n_ret = f.schema.returns().size();
  const size_t rbegin = f.stack->size() - n_ret;
  size_t out_idx = 0;
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& v = (*f.stack)[rbegin + r];
    const bool detached_view = returns_detached_view(f, r);
    const at::Tensor written_dt = f.dtensor_arg(f.written_args[r]);
    if (v.isTensor() && written_dt.defined()) {
      // An out= tensor of another shape was resized by the op: its spec follows (PyTorch sets
      // the out= DTensor's spec to the output spec); in-place ops keep their shapes.
      const size_t k = out_idx++;
      auto* impl = unsafe_get_dtensor_impl(written_dt);
      const auto& metas = f.sharding.output_meta;
      if (f.is_out_argument[static_cast<size_t>(f.written_args[r])] && !f.sharding.output_shape_from_local &&
          k < metas.size() && impl->spec().tensor_meta.shape != metas[k].shape)
        impl->set_local_and_spec(impl->local(), DTensorSpec(*f.mesh, f.sharding.outputs[k], metas[k]));
      v = written_dt;
    } else if (v.isTensor()) {
      v = wrap_output(f, out_idx++, v.toTensor(), detached_view);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> l;
      for (auto& t : v.toTensorVector()) l.push_back(wrap_output(f, out_idx++, t, detached_view));
      v = l;
    }
  }
}

// NOTE: [DTensor fallback] gives the stages.
void dtensor_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t begin = stack->size() - schema.arguments().size();
  if (schema.name() == "aten::set_" && schema.overload_name() == "source_Tensor" && load_whole_tensor(stack, begin))
    return;
  if (detail::run_op_handler(op, stack)) return;  // loss_parallel() and the like
  FallbackCall f(op, stack);
  collect_arguments(f);
  replicate_plain_tensors(f);
  find_written_arguments(f);
  propagate(f);
  check_writes_reach_their_tensor(f);
  if (!f.mesh->get_coordinate().has_value()) {
    return_outside_the_mesh(f);
    return;
  }
  redistribute_inputs(f);
  run_locally(f);
  update_written_dtensor(f);
  wrap_outputs(f);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor_fallback>()); }

}  // namespace dtensor
