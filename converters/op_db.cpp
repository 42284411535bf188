// converters/op_db.cpp: see op_db.h.
#include "converters/op_db.h"

#include "converters/op_check.h"
#include "converters/samples/samples.h"
#include "dtensor/ops/registry.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace dtensor {
namespace testing {

// ---- SampleGen ---------------------------------------------------------------------------------

SampleGen::SampleGen(uint64_t seed) : seed_(seed) {}

at::Tensor SampleGen::tensor(std::vector<int64_t> shape, at::ScalarType dtype, double low,
                             double high) {
  at::Generator gen = at::detail::createCPUGenerator(seed_ * 1000003 + counter_++);
  if (dtype == at::kBool) return at::rand(shape, gen) < 0.5;
  at::Tensor u = at::rand(shape, gen, at::TensorOptions().dtype(at::kDouble));
  at::Tensor v = u * (high - low) + low;
  if (at::isFloatingType(dtype) || at::isComplexType(dtype)) return v.to(dtype);
  return v.floor().to(dtype);
}

at::Tensor SampleGen::positive(std::vector<int64_t> shape, at::ScalarType dtype) {
  return tensor(std::move(shape), dtype, 0.5, 2.0);
}

at::Tensor SampleGen::index(std::vector<int64_t> shape, int64_t high) {
  return tensor(std::move(shape), at::kLong, 0.0, static_cast<double>(high));
}

at::Tensor SampleGen::boolean(std::vector<int64_t> shape) { return tensor(std::move(shape), at::kBool); }

// ---- OpInfo / OpDb -----------------------------------------------------------------------------

namespace {

std::pair<std::string, std::string> split_op(const std::string& op) {
  const auto sep = op.find("::");
  const auto dot = op.find('.', sep == std::string::npos ? 0 : sep + 2);
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

uint64_t name_seed(const std::string& op) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and platforms
  for (unsigned char c : op) h = (h ^ c) * 1099511628211ull;
  return h % 1000000007ull;
}

}  // namespace

std::string OpInfo::name() const { return split_op(op).first; }
std::string OpInfo::overload() const { return split_op(op).second; }

std::vector<OpSample> OpInfo::make_samples() const {
  SampleGen g(name_seed(op));
  return samples(g);
}

void OpDb::add(const std::string& op, const std::string& family, SampleFn samples, bool generated) {
  auto parts = split_op(op);
  TORCH_CHECK(c10::Dispatcher::singleton().findSchema({parts.first, parts.second}).has_value(),
              "OpDb::add: ", op, " is not an operator in the dispatcher (write \"aten::name\" or "
              "\"aten::name.overload\")");
  TORCH_CHECK(find(op) == nullptr, "OpDb::add: ", op, " already has samples (family ",
              find(op)->family, ")");
  index_.emplace(op, ops_.size());
  ops_.push_back(OpInfo{op, family, std::move(samples), generated});
}

const OpInfo* OpDb::find(const std::string& op) const {
  auto it = index_.find(op);
  return it == index_.end() ? nullptr : &ops_[it->second];
}

std::vector<std::string> OpDb::families() const {
  std::vector<std::string> out;
  for (const OpInfo& info : ops_)
    if (std::find(out.begin(), out.end(), info.family) == out.end()) out.push_back(info.family);
  return out;
}

namespace {

// NOTE: [Out= samples from the functional overload]
using ops::out_arguments;

bool is_tensor_list(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::ListType &&
         t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::TensorType;
}

// Whether `functional` takes exactly the arguments of `out_schema` other than its out= ones
// (same names and types, same order) and returns one value per out= argument, of its kind.
bool is_functional_of(const c10::FunctionSchema& functional, const c10::FunctionSchema& out_schema,
                      const std::vector<size_t>& outs) {
  if (functional.name() != out_schema.name() || !out_arguments(functional).empty()) return false;
  const auto& f = functional.arguments();
  const auto& o = out_schema.arguments();
  if (f.size() + outs.size() != o.size() || functional.returns().size() != outs.size()) return false;
  size_t j = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    if (std::find(outs.begin(), outs.end(), i) != outs.end()) continue;
    if (f[j].name() != o[i].name() || f[j].type()->str() != o[i].type()->str()) return false;
    if (f[j].alias_info() && f[j].alias_info()->isWrite()) return false;
    ++j;
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    const c10::TypePtr& r = functional.returns()[k].type();
    const c10::TypePtr& a = o[outs[k]].type();
    const bool tensor = r->kind() == c10::TypeKind::TensorType && a->kind() == c10::TypeKind::TensorType;
    if (!tensor && !(is_tensor_list(r) && is_tensor_list(a))) return false;
  }
  return true;
}

// Shape and dtype of one result (a tensor, or each tensor of a list).
using ResultMeta = std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>;

// The first sample of the functional overload that runs makes the out= sample (more would
// double the 2-D pairwise designs of every out= op, each with one more tensor, for little).
constexpr size_t kOutSamplesPerOp = 1;

void add_out_variant_samples(OpDb& d) {
  // The functional overloads run once here: their warnings (deprecations...) are not for the
  // terminal (NOTE: [Warnings go into the records] in op_check.cpp).
  std::vector<std::string> warnings;
  ScopedWarningCollector quiet(&warnings);
  std::vector<c10::OperatorName> names = c10::Dispatcher::singleton().getAllOpNames();
  std::sort(names.begin(), names.end(), [](const c10::OperatorName& a, const c10::OperatorName& b) {
    return std::tie(a.name, a.overload_name) < std::tie(b.name, b.overload_name);
  });
  std::map<std::string, std::vector<const OpInfo*>> by_name;  // hand-written, by op name
  for (const OpInfo& info : d.ops()) by_name[info.name()].push_back(&info);
  struct Derived {
    std::string op, family;
    SampleFn fn;
  };
  std::vector<Derived> derived;
  for (const auto& name : names) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto handle = c10::Dispatcher::singleton().findSchema(name);
    if (!handle || !handle->hasSchema()) continue;
    const c10::FunctionSchema& schema = handle->schema();
    const std::string key = op_key(schema);
    const std::vector<size_t> outs = out_arguments(schema);
    // Out= overloads without a rule are not sampled (coverage_exclusions.txt says why), except
    // composite ones with several out= tensors (svd.U, qr.Q, linalg_eigh.eigvals: they
    // decompose above DTensor into the out= overloads of ops with rules).
    const bool composite = outs.size() > 1 && handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    if (outs.empty() || d.find(key) != nullptr || !(composite || ops::has_rule(key))) continue;
    auto siblings = by_name.find(schema.name());
    if (siblings == by_name.end()) continue;
    for (const OpInfo* info : siblings->second) {
      const auto dot = info->op.find('.', 6);
      auto f = c10::Dispatcher::singleton().findSchema(
          {info->op.substr(0, dot), dot == std::string::npos ? "" : info->op.substr(dot + 1)});
      if (!f || !is_functional_of(f->schema(), schema, outs)) continue;
      // The results' shapes, from the functional overload on plain tensors (once, here).
      const std::vector<OpSample> made = info->make_samples();
      std::vector<size_t> picked;
      std::vector<std::vector<ResultMeta>> metas;
      for (size_t i = 0; i < made.size() && picked.size() < kOutSamplesPerOp; ++i) {
        try {
          std::vector<c10::IValue> stack = boxed_args(f->schema(), made[i].args, made[i].kwargs);
          f->callBoxed(&stack);
          std::vector<ResultMeta> m;
          for (const auto& v : stack) {
            ResultMeta r;
            if (v.isTensor()) r.emplace_back(v.toTensor().sizes().vec(), v.toTensor().scalar_type());
            else if (v.isTensorList())
              for (const at::Tensor& t : v.toTensorVector()) r.emplace_back(t.sizes().vec(), t.scalar_type());
            else
              break;
            m.push_back(std::move(r));
          }
          if (m.size() != outs.size()) continue;
          picked.push_back(i);
          metas.push_back(std::move(m));
        } catch (const std::exception&) {
          // An invalid sample of the functional overload makes no out= sample.
        }
      }
      if (picked.empty()) break;
      std::vector<std::string> out_names;
      std::vector<bool> out_lists;
      for (size_t k : outs) {
        out_names.push_back(schema.arguments()[k].name());
        out_lists.push_back(is_tensor_list(schema.arguments()[k].type()));
      }
      const OpInfo functional = *info;
      derived.push_back(Derived{
          key, info->family, [functional, picked, metas, out_names, out_lists](SampleGen& g) {
            const std::vector<OpSample> base = functional.make_samples();
            std::vector<OpSample> out;
            for (size_t n = 0; n < picked.size() && picked[n] < base.size(); ++n) {
              OpSample s = base[picked[n]];
              s.variant += "_out";
              for (size_t k = 0; k < out_names.size(); ++k) {
                std::vector<at::Tensor> ts;
                for (const auto& m : metas[n][k]) ts.push_back(g.tensor(m.first, m.second));
                if (out_lists[k]) s.kw(out_names[k], ts);
                else s.kw(out_names[k], ts.at(0));
              }
              out.push_back(std::move(s));
            }
            return out;
          }});
      break;
    }
  }
  for (auto& x : derived) d.add(x.op, x.family, std::move(x.fn));
}

}  // namespace

const OpDb& op_db() {
  static const OpDb db = [] {
    OpDb d;
    samples::add_pointwise_samples(d);
    samples::add_reduction_samples(d);
    samples::add_matrix_samples(d);
    samples::add_view_samples(d);
    samples::add_tensor_samples(d);
    samples::add_index_samples(d);
    samples::add_conv_samples(d);
    samples::add_pool_samples(d);
    samples::add_random_samples(d);
    samples::add_embedding_samples(d);
    samples::add_norm_samples(d);
    samples::add_softmax_loss_samples(d);
    samples::add_linalg_samples(d);
    add_out_variant_samples(d);
    return d;
  }();
  return db;
}

// ---- boxed arguments ---------------------------------------------------------------------------

std::string op_key(const c10::FunctionSchema& schema) {
  return schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
}

namespace {

// Coerces `v` to what a boxed kernel reads for an argument of type `type`.
c10::IValue coerce(const c10::IValue& v, const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (t->kind() == c10::TypeKind::OptionalType) {
    if (v.isNone()) return v;
    t = t->expectRef<c10::OptionalType>().getElementType();
  }
  if (t->kind() == c10::TypeKind::FloatType && v.isInt()) return c10::IValue(static_cast<double>(v.toInt()));
  if (t->kind() == c10::TypeKind::ListType && v.isInt()) {
    const auto elem = t->expectRef<c10::ListType>().getElementType()->kind();
    if (elem == c10::TypeKind::IntType || elem == c10::TypeKind::SymIntType)
      return c10::IValue(std::vector<int64_t>{v.toInt()});
  }
  return v;
}

}  // namespace

std::vector<c10::IValue> boxed_args(const c10::FunctionSchema& schema,
                                    const std::vector<c10::IValue>& args,
                                    const std::vector<std::pair<std::string, c10::IValue>>& kwargs) {
  const auto& formals = schema.arguments();
  const std::string op = op_key(schema);
  TORCH_CHECK(args.size() <= formals.size(), op, " takes ", formals.size(), " arguments but the sample gives ",
              args.size(), " positionally");
  for (const auto& kv : kwargs) {
    const bool known = std::any_of(formals.begin(), formals.end(),
                                   [&](const c10::Argument& a) { return a.name() == kv.first; });
    TORCH_CHECK(known, op, " has no argument named '", kv.first, "' (schema: ", schema, ")");
  }
  std::vector<c10::IValue> out;
  out.reserve(formals.size());
  for (size_t i = 0; i < formals.size(); ++i) {
    const c10::Argument& a = formals[i];
    auto kw = std::find_if(kwargs.begin(), kwargs.end(), [&](const auto& kv) { return kv.first == a.name(); });
    if (i < args.size()) {
      TORCH_CHECK(!a.kwarg_only(), op, ": argument '", a.name(), "' is keyword-only; pass it with kw()");
      TORCH_CHECK(kw == kwargs.end(), op, ": argument '", a.name(), "' given both positionally and by keyword");
      out.push_back(coerce(args[i], a.type()));
    } else if (kw != kwargs.end()) {
      out.push_back(coerce(kw->second, a.type()));
    } else if (a.default_value().has_value()) {
      out.push_back(*a.default_value());
    } else {
      TORCH_CHECK(false, op, ": the sample gives no value for argument '", a.name(), "' (schema: ", schema, ")");
    }
  }
  return out;
}

// ---- generated samples -------------------------------------------------------------------------

namespace {

// Operators that never take dense CPU tensors of a plain dtype, or whose arguments cannot be
// guessed from the schema: left to hand-written samples (or to nobody).
bool excluded_by_name(const std::string& name) {
  static const char* kParts[] = {"cudnn", "miopen", "mkldnn", "mps", "vulkan", "_foreach", "quantiz", "fbgemm",
                                 "sparse", "nested", "_cufft", "xnnpack", "qint", "_fused", "_mkl", "lstm",
                                 "gru_", "rnn_", "_thnn", "coalesce", "_nnpack", "_cuda", "cuda_", "_cslt",
                                 "_nnz", "to_padded", "_pin_memory", "is_pinned", "record_stream", "_fake_",
                                 "fake_quantize", "_make_per", "_values", "_indices", "crow_", "col_indices",
                                 "ccol_", "row_indices", "_standard_gamma", "_sample_dirichlet", "_ctc",
                                 "_compute_linear_combination", "_test", "_debug", "_convert_indices", "_assert",
                                 "_new_zeros_with_same_feature_meta", "_has_same_storage", "_version",
                                 "_autocast", "_use_", "set_", "resize", "_resize", "storage_offset",
                                 "_segment_reduce", "_linalg_check", "_weight_norm_interface", "_cummax",
                                 "_cummin", "_empty_affine", "_empty_per", "_local_scalar", "_pack_padded",
                                 "_pad_packed", "_triton", "_flash", "_efficient", "_transformer",
                                 "_native_multi_head", "_masked_softmax", "_nested", "_to_dense", "_cdist",
                                 "_embedding_bag", "_histogramdd", "_neg_view", "_conj", "_reshape_from",
                                 "_unsafe_index", "lift", "alias_copy", "_addmm_activation", "_autograd",
                                 "_functional", "data", "requires_grad_", "retain_grad", "retains_grad",
                                 "output_nr", "_fw_primal", "_make_dual", "_unpack_dual", "_is_", "is_leaf",
                                 "_backward", "backward", "detach_", "copy_sparse", "_saturate", "swap"};
  for (const char* p : kParts)
    if (name.find(p) != std::string::npos) return true;
  // The schema's defaults make an eval-mode batch norm without running statistics, which
  // libtorch 1.13 does not check: batch_norm_cpu dereferences the missing running_mean
  // (a segmentation fault on plain tensors, that killed opcov's children).
  return name == "native_batch_norm";
}

// The kind of a (non-optional) argument type.
c10::TypeKind kind_of(const c10::TypePtr& t) { return t->kind(); }

bool returns_tensors(const c10::FunctionSchema& schema) {
  if (schema.returns().empty()) return false;
  for (const auto& r : schema.returns()) {
    const auto k = r.type()->kind();
    if (k == c10::TypeKind::TensorType) continue;
    if (k == c10::TypeKind::ListType &&
        r.type()->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::TensorType)
      continue;
    return false;
  }
  return true;
}

}  // namespace

// One sample: every Tensor an [8, 8] float32 tensor (square, so that matrix ops are valid, and
// divisible by 4 and by 2x2), a Tensor[] two of them, Scalar 2, int 1, int[] [8, 8] for
// sizes / [1, 0] for dims / [1] otherwise, bool false, float 0.5; optional and defaulted
// arguments keep their defaults. Not generated: out= variants, ops writing an argument other
// than self, ops without a tensor input or returning non-tensors, and ops with an argument
// of another kind without a default (Generator, str, Dimname, Tensor?[], ...).
std::optional<OpSample> generated_sample(const c10::FunctionSchema& schema, SampleGen& g) {
  return generated_sample(schema, g, 0);
}

std::optional<OpSample> generated_sample(const c10::FunctionSchema& schema, SampleGen& g, int variant) {
  // NOTE: [Generated samples that do work]
  static const struct {
    bool ints2;
    double low, high;
    std::vector<int64_t> sizes;
  } kVariants[kGeneratedVariants] = {{false, -2.0, 2.0, {8, 8}}, {true, -2.0, 2.0, {4, 16}},
                                     {false, 0.1, 0.9, {8, 8}},  {true, 0.1, 0.9, {4, 16}},
                                     {false, 1.1, 3.0, {8, 8}},  {false, -2.0, 2.0, {2, 8, 8}}};
  TORCH_CHECK(variant >= 0 && variant < kGeneratedVariants, "generated_sample: variant ", variant, " out of range");
  const auto& v = kVariants[variant];
  if (schema.name().rfind("aten::", 0) != 0) return std::nullopt;
  if (excluded_by_name(schema.name().substr(6)) || schema.overload_name().find("out") != std::string::npos)
    return std::nullopt;
  if (!returns_tensors(schema)) return std::nullopt;
  OpSample s;
  s.variant = "generated";
  bool any_tensor = false;
  const auto& formals = schema.arguments();
  for (size_t i = 0; i < formals.size(); ++i) {
    const c10::Argument& a = formals[i];
    if (a.alias_info() && a.alias_info()->isWrite() && i != 0) return std::nullopt;
    const c10::TypePtr& t = a.type();
    const std::string& n = a.name();
    if (t->kind() == c10::TypeKind::OptionalType || a.default_value().has_value()) {
      if (!a.default_value().has_value()) s.kw(n, c10::IValue());  // optional without default: None
      continue;
    }
    switch (kind_of(t)) {
      case c10::TypeKind::TensorType:
        s.kw(n, g.tensor({8, 8}, at::kFloat, v.low, v.high));
        any_tensor = true;
        break;
      case c10::TypeKind::ListType: {
        const auto elem = t->expectRef<c10::ListType>().getElementType()->kind();
        if (elem == c10::TypeKind::TensorType) {
          s.kw(n, std::vector<at::Tensor>{g.tensor({8, 8}, at::kFloat, v.low, v.high),
                                          g.tensor({8, 8}, at::kFloat, v.low, v.high)});
          any_tensor = true;
        } else if (elem == c10::TypeKind::IntType || elem == c10::TypeKind::SymIntType) {
          if (n.find("size") != std::string::npos || n == "shape") s.kw(n, v.sizes);
          else if (v.ints2) s.kw(n, std::vector<int64_t>{2, 1});
          else if (n == "dims" || n == "perm") s.kw(n, std::vector<int64_t>{1, 0});
          else s.kw(n, std::vector<int64_t>{1});
        } else {
          return std::nullopt;
        }
        break;
      }
      case c10::TypeKind::NumberType: s.kw(n, 2); break;
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType: s.kw(n, v.ints2 ? 2 : 1); break;
      case c10::TypeKind::BoolType: s.kw(n, v.ints2); break;
      case c10::TypeKind::FloatType: s.kw(n, 0.5); break;
      default: return std::nullopt;
    }
  }
  if (!any_tensor) return std::nullopt;
  return s;
}

namespace {

// 0: does work without NaN; 1: does work with some NaN; 2: trivial or throws.
int probe_variant(const c10::FunctionSchema& schema, uint64_t seed, int variant) {
  // The op's warnings (stft, triangular_solve deprecations...) are not for the terminal; the
  // case's own run records them (NOTE: [Warnings go into the records] in op_check.cpp).
  std::vector<std::string> warnings;
  ScopedWarningCollector quiet(&warnings);
  SampleGen g(seed);
  std::optional<OpSample> s = generated_sample(schema, g, variant);
  if (!s) return 2;
  try {
    auto dot = op_key(schema).find('.', 6);
    const std::string key = op_key(schema);
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(
        key.substr(0, dot).c_str(), dot == std::string::npos ? "" : key.substr(dot + 1).c_str());
    std::vector<c10::IValue> stack = boxed_args(schema, s->args, s->kwargs);
    std::vector<at::Tensor> inputs;
    for (const auto& v : stack)
      if (v.isTensor()) inputs.push_back(v.toTensor().clone());
      else if (v.isTensorList())
        for (const at::Tensor& t : v.toTensorList().vec()) inputs.push_back(t.clone());
    handle.callBoxed(&stack);
    std::vector<at::Tensor> outs;
    for (const auto& v : stack)
      if (v.isTensor()) outs.push_back(v.toTensor());
      else if (v.isTensorList())
        for (const at::Tensor& t : v.toTensorList().vec()) outs.push_back(t);
    bool all_empty = true, all_nan = true, any_nan = false, all_identity = true;
    for (const at::Tensor& o : outs) {
      if (!o.defined()) continue;
      all_empty = all_empty && o.numel() == 0;
      const bool fp = o.is_floating_point() || o.is_complex();
      const bool nan = fp && o.numel() > 0 && at::isnan(o).any().item<bool>();
      any_nan = any_nan || nan;
      all_nan = all_nan && fp && o.numel() > 0 && at::isnan(o).all().item<bool>();
      bool same = false;
      for (const at::Tensor& i : inputs)
        same = same || (i.sizes() == o.sizes() && i.scalar_type() == o.scalar_type() &&
                        (fp ? at::allclose(i, o, 0, 0, true) : at::equal(i, o)));
      all_identity = all_identity && same;
    }
    if (outs.empty() || all_empty || all_nan || all_identity) return 2;
    return any_nan ? 1 : 0;
  } catch (const std::exception&) {
    return 2;
  }
}

// NOTE: [Generated samples that do work]: decided once per process, so that rank threads agree.
int working_variant(const c10::FunctionSchema& schema, uint64_t seed) {
  static std::mutex mu;
  static std::map<std::string, int> chosen;
  std::lock_guard<std::mutex> lk(mu);
  const std::string key = op_key(schema);
  auto it = chosen.find(key);
  if (it != chosen.end()) return it->second;
  int best = 0, best_score = 3;
  for (int k = 0; k < kGeneratedVariants && best_score > 0; ++k) {
    const int score = probe_variant(schema, seed, k);
    if (score < best_score) best = k, best_score = score;
  }
  chosen[key] = best;
  return best;
}

}  // namespace

const OpDb& generated_op_db() {
  static const OpDb db = [] {
    OpDb d;
    const OpDb& written = op_db();
    std::vector<c10::OperatorName> names = c10::Dispatcher::singleton().getAllOpNames();
    std::sort(names.begin(), names.end(), [](const c10::OperatorName& a, const c10::OperatorName& b) {
      return std::tie(a.name, a.overload_name) < std::tie(b.name, b.overload_name);
    });
    for (const auto& name : names) {
      auto handle = c10::Dispatcher::singleton().findSchema(name);
      if (!handle || !handle->hasSchema()) continue;
      const c10::FunctionSchema& schema = handle->schema();
      const std::string key = op_key(schema);
      if (written.find(key) != nullptr) continue;
      SampleGen probe(0);
      if (!generated_sample(schema, probe)) continue;
      d.add(
          key, "generated",
          [schema](SampleGen& gen) {
            std::vector<OpSample> out;
            const int variant = working_variant(schema, gen.seed());
            if (auto s = generated_sample(schema, gen, variant)) out.push_back(std::move(*s));
            return out;
          },
          /*generated=*/true);
    }
    return d;
  }();
  return db;
}

}  // namespace testing
}  // namespace dtensor
