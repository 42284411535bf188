// dtensor/debug/comm_mode.cpp: see NOTE: [CommDebugMode] in comm_mode.h.
#include "dtensor/debug/comm_mode.h"

#include "dtensor/comm/group.h"
#include "dtensor/debug/comm_mode_internal.h"
#include "dtensor/mesh/device_mesh.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/graph_task.h>

#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <unordered_map>

namespace dtensor {
namespace debug {

// The one observer of collectives and modules installed on a thread while a mode is active
// there; it hands what it sees to every active mode of the thread.
struct CommDebugModeAccess : comm::CollectiveObserver, nn::detail::ModuleTracker {
  void on_collective(const comm::CollectiveCall& call) override;
  void on_module_enter(const std::vector<nn::detail::ModuleFrame>& stack) override;
  static void record(CommDebugMode& m, const CollectiveRecord& r) { m.record(r); }
  static void module_entered(CommDebugMode& m, const nn::detail::ModuleFrame& f, const std::string& parent,
                             int depth) {
    m.module_entered(f.fqn, f.type, parent, depth);
  }
  static CommDebugMode* previous(const CommDebugMode& m) { return m.previous_; }
};

namespace {

CommDebugModeAccess g_observer;
thread_local CommDebugMode* t_mode = nullptr;  // the innermost active mode of this thread
thread_local const detail::CollectiveCause* t_cause = nullptr;
thread_local comm::CollectiveObserver* t_saved_observer = nullptr;
thread_local nn::detail::ModuleTracker* t_saved_tracker = nullptr;

const char* count_key(const std::string& op) {
  static const std::unordered_map<std::string, const char*> keys = {
      {"all_reduce", c10d_functional::all_reduce},
      {"all_gather_into", c10d_functional::all_gather_into_tensor},
      {"reduce_scatter_into", c10d_functional::reduce_scatter_tensor},
      {"all_to_all_single", c10d_functional::all_to_all_single},
      {"broadcast", c10d_functional::broadcast},
      {"gather", c10d::gather_},
      {"scatter", c10d::scatter_},
      {"send", c10d::send},
      {"recv", c10d::recv_},
  };
  auto it = keys.find(op);
  return it == keys.end() ? nullptr : it->second;  // barrier: not counted
}

bool in_backward() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

// One line describing a collective (the table's detail at noise level 1 and up).
std::string describe(const CollectiveRecord& r) {
  std::ostringstream os;
  os << r.input_bytes << " B in, " << r.output_bytes << " B out, group of " << r.group_size << " (ranks "
     << ranks_text(r.group_ranks) << ")";
  if (!r.cause.empty()) {
    os << ": " << r.cause;
    if (r.input_index >= 0) os << " input " << r.input_index;
    if (!r.placements_before.empty()) os << " " << r.placements_before << " -> " << r.placements_after;
    if (!r.mesh.empty()) os << " on " << r.mesh;
  }
  return os.str();
}

}  // namespace

void CommDebugModeAccess::on_collective(const comm::CollectiveCall& call) {
  const char* key = count_key(call.op);
  if (!key || !t_mode) return;
  CollectiveRecord r;
  r.op = key;
  r.input_bytes = call.input_bytes;
  r.output_bytes = call.output_bytes;
  r.group_size = call.group.size();
  r.group_ranks = call.group.global_ranks();
  const auto& stack = nn::detail::module_stack();
  for (const auto& f : stack) r.modules.push_back(f.fqn);
  r.backward = in_backward();
  if (const detail::CollectiveCause* c = t_cause) {
    r.cause = *c->op;
    r.input_index = c->input_index;
    r.placements_before = to_string(*c->from);
    r.placements_after = to_string(*c->to);
    r.mesh = c->mesh->to_string();
  }
  for (CommDebugMode* m = t_mode; m; m = previous(*m)) {
    // A mode entered after these modules' forward began (around backward) learns of them here.
    for (size_t i = 0; i < stack.size(); ++i)
      module_entered(*m, stack[i], i ? stack[i - 1].fqn : "Global", static_cast<int>(i + 1));
    record(*m, r);
  }
}

void CommDebugModeAccess::on_module_enter(const std::vector<nn::detail::ModuleFrame>& stack) {
  if (in_backward()) return;  // a recomputation (activation checkpointing) adds no module
  const std::string parent = stack.size() >= 2 ? stack[stack.size() - 2].fqn : "Global";
  for (CommDebugMode* m = t_mode; m; m = previous(*m))
    module_entered(*m, stack.back(), parent, static_cast<int>(stack.size()));
}

// ---- CommDebugMode -------------------------------------------------------------------------

CommDebugMode::CommDebugMode(CommDebugModeOptions options) : options_(options) {}

CommDebugMode::~CommDebugMode() {
  if (active_) exit();
}

CommDebugMode::Active::~Active() {
  if (mode_) mode_->exit();
}

CommDebugMode::Active CommDebugMode::enter() {
  TORCH_CHECK(!active_, "CommDebugMode: entered while already active; exit it first (let its Active go)");
  counts_.clear();
  module_counts_.clear();
  records_.clear();
  modules_.clear();
  module_counts_["Global"];
  modules_.push_back({"Global", "", "", 0});
  if (!t_mode) {
    t_saved_observer = comm::set_collective_observer(&g_observer);
    t_saved_tracker = nn::detail::set_module_tracker(&g_observer);
  }
  previous_ = t_mode;
  t_mode = this;
  active_ = true;
  return Active(this);
}

// Never throws (run by destructors): a mode exited out of order, or on another thread than
// the one that entered it, is unlinked from the chain it is in, if any.
void CommDebugMode::exit() {
  if (!active_) return;
  active_ = false;
  if (t_mode == this) {
    t_mode = previous_;
  } else {
    for (CommDebugMode* m = t_mode; m; m = m->previous_)
      if (m->previous_ == this) {
        m->previous_ = previous_;
        break;
      }
  }
  previous_ = nullptr;
  if (!t_mode && comm::collective_observer() == &g_observer) {
    comm::set_collective_observer(t_saved_observer);
    nn::detail::set_module_tracker(t_saved_tracker);
  }
}

void CommDebugMode::record(CollectiveRecord r) {
  ++counts_[r.op];
  std::set<std::string> counted{"Global"};
  counted.insert(r.modules.begin(), r.modules.end());
  for (const auto& fqn : counted) {
    ModuleCommCounts& c = module_counts_[fqn];
    ++(r.backward ? c.backward : c.forward)[r.op];
  }
  records_.push_back(std::move(r));
}

void CommDebugMode::module_entered(const std::string& fqn, const std::string& type, const std::string& parent,
                                   int depth) {
  for (const auto& m : modules_)
    if (m.fqn == fqn) return;
  module_counts_[fqn];
  modules_.push_back({fqn, type, parent, depth});
}

int64_t CommDebugMode::get_total_counts() const {
  int64_t n = 0;
  for (const auto& kv : counts_) n += kv.second;
  return n;
}

int64_t CommDebugMode::get_total_bytes() const {
  int64_t n = 0;
  for (const auto& r : records_) n += r.input_bytes;
  return n;
}

std::string CommDebugMode::generate_comm_debug_tracing_table(int noise_level) const {
  std::ostringstream os;
  for (const auto& m : modules_) {
    const std::string indent(static_cast<size_t>(4 * m.depth), ' ');
    os << indent << m.fqn << "\n";
    if (noise_level >= 1 && !m.type.empty()) os << indent << "  *module type: " << m.type << "\n";
    auto it = module_counts_.find(m.fqn);
    if (it == module_counts_.end()) continue;
    for (bool backward : {false, true}) {
      const CommCounts& counts = backward ? it->second.backward : it->second.forward;
      if (counts.empty()) continue;
      os << indent << "  " << (backward ? "BACKWARD PASS" : "FORWARD PASS") << "\n";
      for (const auto& kv : counts) {
        os << indent << "    *" << kv.first << ": " << kv.second << "\n";
        if (noise_level < 1) continue;
        // Each collective issued in this module itself (not in a module below it).
        for (const auto& r : records_) {
          const std::string innermost = r.modules.empty() ? "Global" : r.modules.back();
          if (r.op == kv.first && r.backward == backward && innermost == m.fqn)
            os << indent << "      " << describe(r) << "\n";
        }
      }
    }
  }
  return os.str();
}

void CommDebugMode::log_comm_debug_tracing_table_to_file(const std::string& file_name, int noise_level) const {
  std::ofstream out(file_name);
  TORCH_CHECK(out.good(), "CommDebugMode: cannot write the table to '", file_name, "'");
  out << generate_comm_debug_tracing_table(noise_level);
  TORCH_CHECK(out.good(), "CommDebugMode: writing the table to '", file_name, "' failed");
}

std::string CommDebugMode::generate_json_dump(const std::string& file_name, int noise_level) const {
  using nlohmann::json;
  std::map<std::string, std::vector<const ModuleInfo*>> children;
  for (const auto& m : modules_)
    if (m.fqn != "Global") children[m.parent].push_back(&m);
  auto counts_json = [](const CommCounts& c) {
    json a = json::array();
    for (const auto& kv : c) a.push_back(json::array({kv.first, kv.second}));
    return a;
  };
  std::function<json(const ModuleInfo&)> node = [&](const ModuleInfo& m) {
    json j;
    j["fqn"] = m.fqn;
    j["module_type"] = noise_level >= 1 ? m.type : "";
    auto it = module_counts_.find(m.fqn);
    j["collectives_forward"] = counts_json(it == module_counts_.end() ? CommCounts{} : it->second.forward);
    j["collectives_backward"] = counts_json(it == module_counts_.end() ? CommCounts{} : it->second.backward);
    if (noise_level >= 1) {
      json detail = json::array();
      for (const auto& r : records_) {
        const std::string innermost = r.modules.empty() ? "Global" : r.modules.back();
        if (innermost != m.fqn) continue;
        detail.push_back({{"op", r.op},
                          {"input_bytes", r.input_bytes},
                          {"output_bytes", r.output_bytes},
                          {"group_size", r.group_size},
                          {"group_ranks", r.group_ranks},
                          {"is_bw", r.backward},
                          {"cause", r.cause},
                          {"input_index", r.input_index},
                          {"placements_before", r.placements_before},
                          {"placements_after", r.placements_after},
                          {"device_mesh", r.mesh}});
      }
      j["collectives_detail"] = detail;
    }
    json kids = json::array();
    for (const ModuleInfo* c : children[m.fqn]) kids.push_back(node(*c));
    j["children"] = kids;
    return j;
  };
  const std::string text = node(modules_.front()).dump(4);
  if (!file_name.empty()) {
    std::ofstream out(file_name);
    TORCH_CHECK(out.good(), "CommDebugMode: cannot write the JSON dump to '", file_name, "'");
    out << text << "\n";
    TORCH_CHECK(out.good(), "CommDebugMode: writing the JSON dump to '", file_name, "' failed");
  }
  return text;
}

// ---- what the DTensor layer tells the modes ------------------------------------------------
namespace detail {

bool recording() { return t_mode != nullptr; }

CollectiveCause::CollectiveCause(const std::string& op_name, int index, const std::vector<Placement>& from_p,
                                 const std::vector<Placement>& to_p, const DeviceMesh& m)
    : op(&op_name), input_index(index), from(&from_p), to(&to_p), mesh(&m) {
  if (!t_mode) return;
  previous = t_cause;
  t_cause = this;
  set_ = true;
}

CollectiveCause::~CollectiveCause() {
  if (set_ && t_cause == this) t_cause = previous;
}

// A mesh dim whose placement changes from anything but Replicate needs a collective (from
// Replicate, a Shard is a local chunk and a Partial a local share).
bool communicates(const std::vector<Placement>& from, const std::vector<Placement>& to) {
  for (size_t i = 0; i < from.size() && i < to.size(); ++i)
    if (!(from[i] == to[i]) && !is_replicate(from[i])) return true;
  return false;
}

void check_implicit_redistribution(const std::string& op, int input_index, const std::vector<Placement>& from,
                                   const std::vector<Placement>& to, const DeviceMesh& mesh) {
  for (CommDebugMode* m = t_mode; m; m = CommDebugModeAccess::previous(*m)) {
    if (!m->strict() || !communicates(from, to)) continue;
    TORCH_CHECK(false, "CommDebugMode(strict): ", op, " would redistribute its input ", input_index, " from ",
                to_string(from), " to ", to_string(to), " on ", mesh.to_string(),
                ", a collective; redistribute it explicitly first (dtensor::redistribute), or leave strict mode");
  }
}

std::vector<nn::detail::ModuleFrame> module_stack_to_save() {
  if (!t_mode) return {};
  return nn::detail::module_stack();
}

}  // namespace detail
}  // namespace debug
}  // namespace dtensor
