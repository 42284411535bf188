// dtensor/parallel/style.cpp
#include "dtensor/parallel/style.h"

#include "dtensor/nn/distribute_module.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/parallel/fused_matmul.h"
#include "dtensor/tensor/dtensor.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <sstream>

namespace dtensor {

namespace {

std::string where(const std::string& path) { return path.empty() ? "the root module" : "'" + path + "'"; }

std::string bool_string(bool b) { return b ? "true" : "false"; }

std::string layouts_string(const Layouts& ls) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < ls.size(); ++i) os << (i ? ", " : "") << (ls[i] ? to_string(*ls[i]) : "None");
  os << (ls.size() == 1 ? ",)" : ")");
  return os.str();
}

torch::nn::LinearImpl* as_linear(torch::nn::Module& m) { return dynamic_cast<torch::nn::LinearImpl*>(&m); }
torch::nn::EmbeddingImpl* as_embedding(torch::nn::Module& m) { return dynamic_cast<torch::nn::EmbeddingImpl*>(&m); }

// Colwise/Rowwise: a Linear or an Embedding whose weight is still a plain tensor.
void check_linear_or_embedding(torch::nn::Module& module, const std::string& path, const std::string& style) {
  TORCH_CHECK(as_linear(module) || as_embedding(module), style, ": ", where(path), " is a ", module.name(),
              "; ", style, " supports torch::nn::Linear and torch::nn::Embedding (use SequenceParallel, "
              "PrepareModuleInput/Output or distribute_module for other modules)");
  const at::Tensor& w = as_linear(module) ? as_linear(module)->weight : as_embedding(module)->weight;
  TORCH_CHECK(!is_dtensor(w), style, ": ", where(path), " was parallelized before (its weight is a DTensor with ",
              to_string(get_spec(w).placements), "); a module takes one parameter-distributing style");
}

void distribute(torch::nn::Module& module, const std::string& name, at::Tensor& member, const DeviceMesh& mesh,
                Placement p) {
  if (member.defined())
    nn::swap_parameter(module, name,
                       distribute_tensor(member.detach(), mesh, {p}, detail::SrcDataRankGuard::current()));
}

// The tensor at `what` as a DTensor in `given` (wrapping a plain local tensor), then in
// `desired` when that is set. Collective when it redistributes.
at::Tensor to_layout(const c10::IValue& v, const DeviceMesh& mesh, const Placement& given,
                     const std::optional<Placement>& desired, const std::string& what) {
  TORCH_CHECK(v.isTensor(), what, " is a ", v.tagKind(), ", not a tensor; use nullopt for its layout");
  at::Tensor t = v.toTensor();
  if (!is_dtensor(t)) t = from_local(t, mesh, {given}, /*run_check=*/false);
  if (desired) {
    const auto want = normalize_placements({*desired}, t.dim());
    if (get_spec(t).placements != want) t = redistribute(t, mesh, want);
  }
  return t;
}

// Input hook of Colwise/Rowwise: input 0 in `given`, redistributed to `desired`.
nn::ForwardPreHook first_input_hook(const DeviceMesh& mesh, Placement given, Placement desired, std::string what) {
  return [=](torch::nn::Module&, nn::ForwardInputs& inputs) {
    TORCH_CHECK(!inputs.empty(), what, ": the module was called without inputs");
    inputs[0] = to_layout(inputs[0], mesh, given, desired, what + ": input 0");
  };
}

// Output hook of Colwise/Rowwise: the DTensor output brought to `layout`, local if asked.
nn::ForwardHook output_hook(const DeviceMesh& mesh, Placement layout, bool use_local, std::string what) {
  return [=](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue& out) {
    TORCH_CHECK(out.isTensor() && is_dtensor(out.toTensor()), what, ": expected the module to return a DTensor");
    at::Tensor t = to_layout(out, mesh, layout, layout, what + ": output");
    out = use_local ? to_local(t) : t;
  };
}

}  // namespace

// ---- ColwiseParallel / RowwiseParallel ---------------------------------------------------------

namespace detail {

template <class Style>
std::string LinearStyle<Style>::to_string() const {
  return std::string(name_) + "(input_layouts=" + dtensor::to_string(input_layouts_) +
         ", output_layouts=" + dtensor::to_string(output_layouts_) +
         ", use_local_output=" + bool_string(use_local_output_) + (async_tp_ ? ", async_tp=true" : "") + ")";
}

template <class Style>
void LinearStyle<Style>::check(torch::nn::Module& module, const std::string& path) const {
  check_linear_or_embedding(module, path, name_);
  if (!async_tp_) return;
  TORCH_CHECK(as_linear(module), name_, ": ", where(path), " is a ", module.name(),
              "; async_tp fuses a collective with a Linear's matmul and supports torch::nn::Linear only");
  // Colwise gathers its input, Rowwise scatters its output: that layout must be a sequence shard.
  const bool colwise = std::string(name_) == "ColwiseParallel";
  const Placement& p = colwise ? input_layouts_ : output_layouts_;
  TORCH_CHECK(is_shard(p) && std::get<Shard>(p).dim != -1, name_, " at ", where(path), ": async_tp needs ",
              colwise ? "input_layouts" : "output_layouts", " Shard(d) on a dim other than the last (features), got ",
              dtensor::to_string(p), colwise ? "; a replicated input has no all-gather to overlap"
                                             : "; a replicated output has no reduce-scatter to overlap");
}

template class LinearStyle<ColwiseParallel>;
template class LinearStyle<RowwiseParallel>;

}  // namespace detail

namespace {

// The global shape of the Linear's output for the DTensor input `x`: x's with the last dim
// out_features.
FromLocalOptions linear_output_meta(const at::Tensor& x, const at::Tensor& weight) {
  FromLocalOptions o;
  std::vector<int64_t> shape = get_spec(x).tensor_meta.shape;
  shape.back() = get_spec(weight).tensor_meta.shape[0];
  const auto st = c10::contiguous_strides(shape);
  o.shape = shape;
  o.stride = std::vector<int64_t>(st.begin(), st.end());
  return o;
}

// The sequence dim of an async_tp Linear: `p`'s shard dim wrapped for x's dims, checked even.
int64_t async_tp_dim(const at::Tensor& x, const Placement& p, const DeviceMesh& mesh, const std::string& what) {
  const int64_t nd = static_cast<int64_t>(get_spec(x).tensor_meta.shape.size());
  const int64_t given = std::get<Shard>(p).dim;
  const int64_t d = given < 0 ? given + nd : given;
  TORCH_CHECK(d >= 0 && d < nd - 1, what, ": async_tp shards dim ", given, " of an input of ", nd,
              " dims; it must be a dim other than the last (features)");
  const int64_t len = get_spec(x).tensor_meta.shape[d], n = mesh.size();
  TORCH_CHECK(len % n == 0, what, ": async_tp needs dim ", d, " (length ", len, ") divisible by the mesh size ", n,
              "; pipelined blocks must be even (turn async_tp off for uneven sequences)");
  return d;
}

}  // namespace

void ColwiseParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const {
  check(module, path);
  if (auto* lin = as_linear(module)) {
    distribute(module, "weight", lin->weight, mesh, Shard{0});
    distribute(module, "bias", lin->bias, mesh, Shard{0});
  } else {
    distribute(module, "weight", as_embedding(module)->weight, mesh, Shard{1});
  }
  const std::string what = "ColwiseParallel at " + where(path);
  if (async_tp_) {
    // The input stays a sequence shard; the override gathers it inside the matmul.
    nn::register_forward_pre_hook(module, first_input_hook(mesh, input_layouts_, input_layouts_, what));
    const Placement seq = input_layouts_;
    nn::register_forward_override(module, [mesh, seq, what](torch::nn::Module& m, const nn::ForwardInputs& in) {
      auto* lin = as_linear(m);
      const at::Tensor x = in[0].toTensor();
      const int64_t d = async_tp_dim(x, seq, mesh, what);
      at::Tensor y = fused_all_gather_matmul(to_local(x), to_local(lin->weight).t(), d, mesh.get_group(0));
      if (lin->bias.defined()) y = y + to_local(lin->bias);
      return c10::IValue(from_local(y, mesh, {Shard{y.dim() - 1}}, linear_output_meta(x, lin->weight)));
    });
  } else {
    nn::register_forward_pre_hook(module, first_input_hook(mesh, input_layouts_, Replicate{}, what));
  }
  nn::register_forward_hook(module, output_hook(mesh, output_layouts_, use_local_output_, what));
}

void RowwiseParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const {
  check(module, path);
  Placement desired_input = Replicate{};
  if (auto* lin = as_linear(module)) {
    distribute(module, "weight", lin->weight, mesh, Shard{1});
    distribute(module, "bias", lin->bias, mesh, Replicate{});
    desired_input = Shard{-1};
  } else {
    distribute(module, "weight", as_embedding(module)->weight, mesh, Shard{0});
  }
  const std::string what = "RowwiseParallel at " + where(path);
  nn::register_forward_pre_hook(module, first_input_hook(mesh, input_layouts_, desired_input, what));
  if (async_tp_) {
    // The Partial product never exists whole: the override reduce-scatters it block by block.
    const Placement seq = output_layouts_;
    nn::register_forward_override(module, [mesh, seq, what](torch::nn::Module& m, const nn::ForwardInputs& in) {
      auto* lin = as_linear(m);
      const at::Tensor x = in[0].toTensor();
      const int64_t d = async_tp_dim(x, seq, mesh, what);
      at::Tensor y = fused_matmul_reduce_scatter(to_local(x), to_local(lin->weight).t(), d, mesh.get_group(0));
      // Each rank adds the replicated bias to its rows, so its gradient is this rank's share: Partial.
      if (lin->bias.defined()) y = y + to_local(lin->bias, std::vector<Placement>{Partial{}});
      return c10::IValue(from_local(y, mesh, {Shard{d}}, linear_output_meta(x, lin->weight)));
    });
  }
  nn::register_forward_hook(module, output_hook(mesh, output_layouts_, use_local_output_, what));
}

// ---- SequenceParallel ------------------------------------------------------------------------

SequenceParallel& SequenceParallel::sequence_dim(int64_t d) {
  sequence_dim_ = d;
  return *this;
}
SequenceParallel& SequenceParallel::use_local_output(bool v) {
  use_local_output_ = v;
  return *this;
}

std::string SequenceParallel::to_string() const {
  return "SequenceParallel(sequence_dim=" + std::to_string(sequence_dim_) +
         ", use_local_output=" + bool_string(use_local_output_) + ")";
}

void SequenceParallel::check(torch::nn::Module& module, const std::string& path) const {
  for (const auto& kv : module.named_modules("", /*include_self=*/true)) {
    for (const auto& p : kv.value()->named_parameters(/*recurse=*/false)) {
      if (!p.value().defined()) continue;
      const std::string name = kv.key().empty() ? p.key() : kv.key() + "." + p.key();
      TORCH_CHECK(!is_dtensor(p.value()), "SequenceParallel: parameter '", name, "' of ", where(path),
                  " is already a DTensor (", dtensor::to_string(get_spec(p.value()).placements),
                  "); a module takes one parameter-distributing style");
      TORCH_CHECK(nn::has_parameter_member(*kv.value(), p.key()), "SequenceParallel: ", where(path), " (",
                  module.name(), ") cannot be replicated: parameter '", name, "' of ", kv.value()->name(),
                  " has no known member. SequenceParallel supports modules whose parameters "
                  "dtensor::nn::swap_parameter knows (LayerNorm, models::RMSNorm, parameter-free modules such "
                  "as Dropout, or a type registered with dtensor::nn::register_parameter_member)");
    }
  }
}

void SequenceParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const {
  check(module, path);
  for (const auto& kv : module.named_modules("", /*include_self=*/true))
    nn::distribute_parameters(*kv.value(), mesh, {Replicate{}});
  const std::string what = "SequenceParallel at " + where(path);
  const Placement seq = Shard{sequence_dim_};
  nn::register_forward_pre_hook(module, first_input_hook(mesh, seq, seq, what));
  if (use_local_output_)
    nn::register_forward_hook(module, [what](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue& out) {
      TORCH_CHECK(out.isTensor() && is_dtensor(out.toTensor()), what, ": expected the module to return a DTensor");
      out = to_local(out.toTensor());
    });
}

// ---- PrepareModuleInput / PrepareModuleOutput ---------------------------------------------------

namespace {

void check_layout_lengths(const Layouts& given, const Layouts& desired, const char* style, const char* a,
                          const char* b, const std::string& path) {
  TORCH_CHECK(given.size() == desired.size(), style, " at ", where(path), ": ", a, " ", layouts_string(given),
              " and ", b, " ", layouts_string(desired), " must have the same length");
  TORCH_CHECK(!given.empty(), style, " at ", where(path), ": ", a, " is empty; give one layout per ",
              std::string(a).find("input") != std::string::npos ? "input" : "output");
  for (size_t i = 0; i < given.size(); ++i)
    TORCH_CHECK(given[i].has_value() || !desired[i].has_value(), style, " at ", where(path), ": entry ", i,
                " of ", b, " is ", to_string(*desired[i]), " but its ", a, " entry is None; give both or neither");
}

// Converts values[i] for each layout; `what` names the position in errors.
void prepare(std::vector<c10::IValue>& values, const Layouts& given, const Layouts& desired, bool use_local,
             const DeviceMesh& mesh, const std::string& what, const char* kind) {
  TORCH_CHECK(values.size() == given.size(), what, ": the module has ", values.size(), " ", kind,
              "s but the layouts have ", given.size(), " entries (", layouts_string(given), ")");
  for (size_t i = 0; i < values.size(); ++i) {
    if (!given[i]) continue;
    at::Tensor t = to_layout(values[i], mesh, *given[i], desired[i], what + ": " + kind + " " + std::to_string(i));
    values[i] = use_local ? to_local(t) : t;
  }
}

std::string kwarg_layouts_string(const KwargLayouts& l) {
  std::string out = "{";
  for (const auto& [k, p] : l) out += (out.size() > 1 ? ", '" : "'") + k + "': " + to_string(p);
  return out + "}";
}

// The entries of string-keyed dict inputs (keyword arguments) named in `given`.
void prepare_kwargs(std::vector<c10::IValue>& values, const KwargLayouts& given, const KwargLayouts& desired,
                    bool use_local, const DeviceMesh& mesh, const std::string& what) {
  if (given.empty()) return;
  for (auto& v : values) {
    if (!v.isGenericDict()) continue;
    c10::Dict<c10::IValue, c10::IValue> d = v.toGenericDict();
    if (!d.keyType()->cast<c10::StringType>()) continue;
    c10::Dict<c10::IValue, c10::IValue> out = d.copy();
    for (const auto& [key, layout] : given) {
      auto it = out.find(c10::IValue(key));
      if (it == out.end()) continue;
      const auto want = desired.find(key);
      at::Tensor t = to_layout(it->value(), mesh, layout,
                               want == desired.end() ? std::nullopt : std::optional<Placement>(want->second),
                               what + ": keyword input '" + key + "'");
      out.insert_or_assign(c10::IValue(key), use_local ? c10::IValue(to_local(t)) : c10::IValue(t));
    }
    v = c10::IValue(out);
  }
}

}  // namespace

namespace detail {
namespace {
thread_local std::optional<int64_t> t_src_data_rank = 0;
}  // namespace
SrcDataRankGuard::SrcDataRankGuard(std::optional<int64_t> src_data_rank) : prev_(t_src_data_rank) {
  t_src_data_rank = src_data_rank;
}
SrcDataRankGuard::~SrcDataRankGuard() { t_src_data_rank = prev_; }
std::optional<int64_t> SrcDataRankGuard::current() { return t_src_data_rank; }
}  // namespace detail

PrepareModuleInput& PrepareModuleInput::input_kwarg_layouts(KwargLayouts l) {
  input_kwarg_layouts_ = std::move(l);
  return *this;
}
PrepareModuleInput& PrepareModuleInput::desired_input_kwarg_layouts(KwargLayouts l) {
  desired_input_kwarg_layouts_ = std::move(l);
  return *this;
}

PrepareModuleInput& PrepareModuleInput::input_layouts(Layouts l) {
  input_layouts_ = std::move(l);
  return *this;
}
PrepareModuleInput& PrepareModuleInput::desired_input_layouts(Layouts l) {
  desired_input_layouts_ = std::move(l);
  return *this;
}
PrepareModuleInput& PrepareModuleInput::use_local_output(bool v) {
  use_local_output_ = v;
  return *this;
}

std::string PrepareModuleInput::to_string() const {
  std::string kwargs;
  if (!input_kwarg_layouts_.empty() || !desired_input_kwarg_layouts_.empty())
    kwargs = ", input_kwarg_layouts=" + kwarg_layouts_string(input_kwarg_layouts_) +
             ", desired_input_kwarg_layouts=" + kwarg_layouts_string(desired_input_kwarg_layouts_);
  return "PrepareModuleInput(input_layouts=" + layouts_string(input_layouts_) +
         ", desired_input_layouts=" + layouts_string(desired_input_layouts_) + kwargs +
         ", use_local_output=" + bool_string(use_local_output_) + ")";
}

void PrepareModuleInput::check(torch::nn::Module&, const std::string& path) const {
  for (const auto& kv : desired_input_kwarg_layouts_)
    TORCH_CHECK(input_kwarg_layouts_.count(kv.first), "PrepareModuleInput at ", where(path),
                ": desired_input_kwarg_layouts names '", kv.first, "' but input_kwarg_layouts does not (",
                kwarg_layouts_string(input_kwarg_layouts_), "); give both or neither");
  // Keyword layouts alone are enough (PyTorch: input_layouts=None).
  if (input_layouts_.empty() && desired_input_layouts_.empty() && !input_kwarg_layouts_.empty()) return;
  check_layout_lengths(input_layouts_, desired_input_layouts_, "PrepareModuleInput", "input_layouts",
                       "desired_input_layouts", path);
}

void PrepareModuleInput::apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const {
  check(module, path);
  const std::string what = "PrepareModuleInput at " + where(path);
  nn::register_forward_pre_hook(module, [=, given = input_layouts_, desired = desired_input_layouts_,
                                         kw = input_kwarg_layouts_, kw_desired = desired_input_kwarg_layouts_,
                                         local = use_local_output_](torch::nn::Module&, nn::ForwardInputs& inputs) {
    if (!given.empty()) prepare(inputs, given, desired, local, mesh, what, "input");
    prepare_kwargs(inputs, kw, kw_desired, local, mesh, what);
  });
}

PrepareModuleOutput& PrepareModuleOutput::output_layouts(Layouts l) {
  output_layouts_ = std::move(l);
  return *this;
}
PrepareModuleOutput& PrepareModuleOutput::desired_output_layouts(Layouts l) {
  desired_output_layouts_ = std::move(l);
  return *this;
}
PrepareModuleOutput& PrepareModuleOutput::use_local_output(bool v) {
  use_local_output_ = v;
  return *this;
}

std::string PrepareModuleOutput::to_string() const {
  return "PrepareModuleOutput(output_layouts=" + layouts_string(output_layouts_) +
         ", desired_output_layouts=" + layouts_string(desired_output_layouts_) +
         ", use_local_output=" + bool_string(use_local_output_) + ")";
}

void PrepareModuleOutput::check(torch::nn::Module&, const std::string& path) const {
  check_layout_lengths(output_layouts_, desired_output_layouts_, "PrepareModuleOutput", "output_layouts",
                       "desired_output_layouts", path);
}

void PrepareModuleOutput::apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const {
  check(module, path);
  const std::string what = "PrepareModuleOutput at " + where(path);
  nn::register_forward_hook(module, [=, given = output_layouts_, desired = desired_output_layouts_,
                                     local = use_local_output_](torch::nn::Module&, const nn::ForwardInputs&,
                                                                c10::IValue& out) {
    const bool tuple = out.isTuple();
    std::vector<c10::IValue> outs = tuple ? out.toTupleRef().elements().vec() : std::vector<c10::IValue>{out};
    prepare(outs, given, desired, local, mesh, what, "output");
    out = tuple ? c10::IValue(c10::ivalue::Tuple::create(std::move(outs))) : outs[0];
  });
}

PrepareModuleInputOutput& PrepareModuleInputOutput::input_layouts(Layouts l) {
  input_.input_layouts(std::move(l));
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::desired_input_layouts(Layouts l) {
  input_.desired_input_layouts(std::move(l));
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::input_kwarg_layouts(KwargLayouts l) {
  input_.input_kwarg_layouts(std::move(l));
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::desired_input_kwarg_layouts(KwargLayouts l) {
  input_.desired_input_kwarg_layouts(std::move(l));
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::use_local_input(bool v) {
  input_.use_local_output(v);
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::output_layouts(Layouts l) {
  output_.output_layouts(std::move(l));
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::desired_output_layouts(Layouts l) {
  output_.desired_output_layouts(std::move(l));
  return *this;
}
PrepareModuleInputOutput& PrepareModuleInputOutput::use_local_output(bool v) {
  output_.use_local_output(v);
  return *this;
}

std::string PrepareModuleInputOutput::to_string() const {
  return "PrepareModuleInputOutput(" + input_.to_string() + ", " + output_.to_string() + ")";
}

void PrepareModuleInputOutput::check(torch::nn::Module& module, const std::string& path) const {
  input_.check(module, path);
  output_.check(module, path);
}

void PrepareModuleInputOutput::apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const {
  input_.apply(module, mesh, path);
  output_.apply(module, mesh, path);
}

}  // namespace dtensor
