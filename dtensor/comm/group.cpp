// dtensor/comm/group.cpp: argument checks shared by Group implementations, and the
// process-wide / thread-local default group.
#include "dtensor/comm/group.h"
#include "dtensor/comm/group_checks_internal.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>

namespace dtensor {
namespace comm {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::PRODUCT: return "product";
    case ReduceOp::MIN: return "min";
    case ReduceOp::MAX: return "max";
  }
  return "unknown";
}

ReduceOp reduce_op_from_string(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "sum") return ReduceOp::SUM;
  if (n == "avg") return ReduceOp::AVG;
  if (n == "product" || n == "prod") return ReduceOp::PRODUCT;
  if (n == "min") return ReduceOp::MIN;
  if (n == "max") return ReduceOp::MAX;
  TORCH_CHECK(false, "unknown reduce op '", name, "': expected one of sum, avg, product, min, max");
}

int Group::group_rank_of(int global_rank) const {
  const auto& g = global_ranks();
  auto it = std::find(g.begin(), g.end(), global_rank);
  return it == g.end() ? -1 : static_cast<int>(it - g.begin());
}

void Group::gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int dst) {
  std::vector<at::Tensor> outs;
  if (rank() == dst)
    for (int r = 0; r < size(); ++r) outs.push_back(at::empty_like(input, at::MemoryFormat::Contiguous));
  gather_async(input, outs, dst)->wait();
  if (rank() == dst) outputs = std::move(outs);
}

std::string Group::describe() const {
  std::ostringstream os;
  os << backend() << " group of " << size() << " (ranks ";
  const auto& g = global_ranks();
  for (size_t i = 0; i < g.size(); ++i) os << (i ? "," : "") << g[i];
  os << "), rank " << rank();
  return os.str();
}

const GroupName& Group::name() const {
  std::call_once(name_once_, [this] { name_ = std::make_shared<const std::string>(describe()); });
  return name_;
}

namespace detail {

void check_gather_outputs(const Group& g, const at::Tensor& input, const std::vector<at::Tensor>& outputs) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == g.size(), "gather on ", g.describe(), ": dst rank passed ",
              outputs.size(), " output tensors, expected ", g.size());
  for (const auto& t : outputs)
    TORCH_CHECK(t.sizes() == input.sizes() && t.scalar_type() == input.scalar_type(), "gather on ", g.describe(),
                ": an output is ", t.scalar_type(), t.sizes(), " but the input is ", input.scalar_type(),
                input.sizes());
}

void check_scatter_inputs(const Group& g, const at::Tensor& output, const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == g.size(), "scatter on ", g.describe(), ": src rank passed ",
              inputs.size(), " tensors, expected ", g.size());
  for (const auto& t : inputs)
    TORCH_CHECK(t.sizes() == output.sizes() && t.scalar_type() == output.scalar_type(), "scatter on ", g.describe(),
                ": an input is ", t.scalar_type(), t.sizes(), " but the output is ", output.scalar_type(),
                output.sizes());
}

void check_rank_arg(const Group& g, const char* op, const char* what, int r) {
  TORCH_CHECK(r >= 0 && r < g.size(), op, ": ", what, "=", r, " is not a rank of the ",
              g.describe(), "; expected 0 <= ", what, " < ", g.size());
}

void check_avg(const Group& g, const char* op, const at::Tensor& t, ReduceOp r) {
  TORCH_CHECK(r != ReduceOp::AVG || at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()), op,
              " on ", g.describe(), ": ReduceOp::AVG needs a floating dtype, got ", t.scalar_type(),
              "; use SUM and divide");
}

void check_all_gather_shapes(const Group& g, const at::Tensor& out, const at::Tensor& in) {
  TORCH_CHECK(out.defined() && in.defined(), "all_gather_into on ", g.describe(),
              ": input and output must be defined tensors");
  TORCH_CHECK(in.dim() >= 1 && out.dim() == in.dim(), "all_gather_into on ", g.describe(),
              ": input ", in.sizes(), " and output ", out.sizes(),
              " must have the same number (>= 1) of dims");
  auto expected = in.sizes().vec();
  expected[0] *= g.size();
  TORCH_CHECK(out.sizes().vec() == expected, "all_gather_into on ", g.describe(), ": output is ",
              out.sizes(), " but input ", in.sizes(), " needs output ", c10::IntArrayRef(expected));
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "all_gather_into on ", g.describe(),
              ": output dtype ", out.scalar_type(), " differs from input dtype ", in.scalar_type());
  TORCH_CHECK(out.is_contiguous(), "all_gather_into on ", g.describe(),
              ": output must be contiguous");
}

void check_reduce_scatter_shapes(const Group& g, const at::Tensor& out, const at::Tensor& in) {
  TORCH_CHECK(out.defined() && in.defined(), "reduce_scatter_into on ", g.describe(),
              ": input and output must be defined tensors");
  TORCH_CHECK(in.dim() >= 1 && out.dim() == in.dim(), "reduce_scatter_into on ", g.describe(),
              ": input ", in.sizes(), " and output ", out.sizes(),
              " must have the same number (>= 1) of dims");
  auto expected = out.sizes().vec();
  expected[0] *= g.size();
  TORCH_CHECK(in.sizes().vec() == expected, "reduce_scatter_into on ", g.describe(),
              ": input is ", in.sizes(), " but output ", out.sizes(), " needs input ",
              c10::IntArrayRef(expected));
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "reduce_scatter_into on ", g.describe(),
              ": output dtype ", out.scalar_type(), " differs from input dtype ", in.scalar_type());
}

static std::vector<int64_t> resolve_splits(const Group& g, const at::Tensor& t,
                                           const std::vector<int64_t>& splits, const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  if (splits.empty()) {
    TORCH_CHECK(rows % g.size() == 0, "all_to_all_single on ", g.describe(), ": ", which,
                " has ", rows, " rows, not divisible by the group size ", g.size(),
                "; pass explicit ", which, "_splits");
    return std::vector<int64_t>(g.size(), rows / g.size());
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == g.size(), "all_to_all_single on ", g.describe(),
              ": ", which, "_splits has ", splits.size(), " entries, expected ", g.size());
  int64_t total = 0;
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "all_to_all_single on ", g.describe(), ": negative entry in ", which,
                "_splits");
    total += s;
  }
  TORCH_CHECK(total == rows, "all_to_all_single on ", g.describe(), ": ", which,
              "_splits sum to ", total, " but the ", which, " has ", rows, " rows");
  return splits;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> resolve_all_to_all_splits(
    const Group& g, const at::Tensor& out, const at::Tensor& in,
    const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  TORCH_CHECK(out.dim() >= 1 && in.dim() == out.dim(), "all_to_all_single on ", g.describe(),
              ": input ", in.sizes(), " and output ", out.sizes(),
              " must have the same number (>= 1) of dims");
  TORCH_CHECK(in.sizes().slice(1) == out.sizes().slice(1), "all_to_all_single on ",
              g.describe(), ": input ", in.sizes(), " and output ", out.sizes(),
              " must agree in every dim but 0");
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "all_to_all_single on ", g.describe(),
              ": output dtype ", out.scalar_type(), " differs from input dtype ", in.scalar_type());
  return {resolve_splits(g, out, output_splits, "output"),
          resolve_splits(g, in, input_splits, "input")};
}

void check_subgroup_ranks(const Group& g, const std::vector<int>& ranks) {
  TORCH_CHECK(!ranks.empty(), "new_subgroup on ", g.describe(), ": the rank list is empty");
  std::set<int> seen;
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < g.size(), "new_subgroup on ", g.describe(), ": rank ", r,
                " is not in the group (size ", g.size(), ")");
    TORCH_CHECK(seen.insert(r).second, "new_subgroup on ", g.describe(), ": rank ", r,
                " is listed twice");
  }
}

}  // namespace detail

// ---- observers (NOTE: [Collective observers]) ---------------------------------------------
namespace {
thread_local CollectiveObserver* t_observer = nullptr;
thread_local int t_observed_depth = 0;
}  // namespace

CollectiveObserver* collective_observer() { return t_observer; }
CollectiveObserver* set_collective_observer(CollectiveObserver* observer) {
  CollectiveObserver* previous = t_observer;
  t_observer = observer;
  return previous;
}

namespace detail {
ObservedCollective::ObservedCollective(const Group& g, const char* op, int64_t input_bytes, int64_t output_bytes) {
  if (t_observed_depth++ == 0 && t_observer) {
    try {
      t_observer->on_collective(CollectiveCall{op, g, input_bytes, output_bytes});
    } catch (...) {
      --t_observed_depth;  // no destructor runs for a constructor that throws
      throw;
    }
  }
}
ObservedCollective::~ObservedCollective() { --t_observed_depth; }

int64_t nbytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0; }
int64_t nbytes(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += nbytes(t);
  return n;
}
}  // namespace detail

// ---- default group -----------------------------------------------------------------------
namespace {
std::mutex g_default_mu;
GroupPtr g_default;
thread_local GroupPtr t_default;
}  // namespace

GroupPtr default_group() {
  if (t_default) return t_default;
  std::lock_guard<std::mutex> lk(g_default_mu);
  TORCH_CHECK(g_default != nullptr,
              "no default process group: call dtensor::comm::init_process_group(...) (or run "
              "inside a dtensor::testing fixture, which creates one) before using collectives");
  return g_default;
}

bool is_initialized() {
  if (t_default) return true;
  std::lock_guard<std::mutex> lk(g_default_mu);
  return g_default != nullptr;
}

void set_default_group(GroupPtr group) {
  std::lock_guard<std::mutex> lk(g_default_mu);
  g_default = std::move(group);
}

void set_thread_default_group(GroupPtr group) { t_default = std::move(group); }

GroupPtr new_group(const std::vector<int>& ranks) { return default_group()->new_subgroup(ranks); }

void destroy_process_group() {
  if (t_default) {
    t_default.reset();
    return;
  }
  std::lock_guard<std::mutex> lk(g_default_mu);
  g_default.reset();
}

}  // namespace comm
}  // namespace dtensor
