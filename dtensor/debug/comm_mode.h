// dtensor/debug/comm_mode.h: CommDebugMode, PyTorch's torch.distributed.tensor.debug.CommDebugMode:
// a scope that records every collective this rank issues inside it, per kind and per module
// (forward and backward), and, beyond PyTorch's, each collective's bytes and group and the
// reason it happened (the DTensor op and input whose placement forced it, the placements
// before and after). A strict mode raises instead of redistributing implicitly.
//
//   dtensor::debug::CommDebugMode comm_mode;
//   {
//     auto active = comm_mode.enter();                 // PyTorch: `with comm_mode:`
//     at::Tensor out = dtensor::nn::call(model, x);    // modules are seen through nn::call
//     out.sum().backward();
//   }
//   comm_mode.get_total_counts();                                       // 1
//   comm_mode.get_comm_counts()[dtensor::debug::c10d_functional::all_reduce];  // 1
//   comm_mode.get_comm_module_counts().at("MLPModule.net2").forward;    // {all_reduce: 1}
//   std::cout << comm_mode.generate_comm_debug_tracing_table(/*noise_level=*/1);
//   comm_mode.generate_json_dump("comm_mode_log.json");
//
// NOTE: [CommDebugMode]
// - What is recorded: every collective of a comm::Group issued on the thread that entered the
//   mode (NOTE: [Collective observers] in dtensor/comm/group.h) — DTensor redistributions,
//   FSDP's all-gathers and reduce-scatters, tensor-parallel styles, and collectives called
//   directly — under PyTorch's count keys: the functional collective's name
//   ("c10d_functional.all_reduce"), c10d's for gather, scatter, send and recv ("c10d.gather_").
//   A barrier moves no data and is not counted (as in PyTorch). PyTorch counts send and recv
//   not at all; they are counted here, since they move bytes too.
// - Per module: a collective counts on "Global", on the module it was issued in and on every
//   module that module was called from (NOTE: [Module path] in dtensor/nn/hooks.h), under
//   forward or backward. In backward, a redistribution's gradient step (RedistributeBackward,
//   FromLocalBackward) is attributed to the modules its forward ran in, and so are FSDP's
//   backward hooks (all-gathers, prefetches and reduce-scatters) and its post-backward run by
//   the callback that ends a backward.
// - Entering clears what was recorded (as PyTorch's __enter__). Modes nest: every mode active on
//   the thread records. A mode is entered and exited on one thread; with ranks as threads each
//   rank thread enters its own.
// - Strict (CommDebugModeOptions::strict): an op that would redistribute an input implicitly
//   with a collective (its sharding rule asks for other placements than the input has, and
//   some mesh dim changes from Shard or Partial) raises on every rank before communicating,
//   naming the op, the input, its placements and the ones asked for. Local changes (from
//   Replicate to a Shard's chunk or a Partial's share), explicit redistribute() calls and their
//   gradients are allowed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtensor {
namespace debug {

// Count keys (PyTorch's op names, as torch.ops.c10d_functional.all_reduce prints).
namespace c10d_functional {
constexpr const char* all_reduce = "c10d_functional.all_reduce";
constexpr const char* all_gather_into_tensor = "c10d_functional.all_gather_into_tensor";
constexpr const char* reduce_scatter_tensor = "c10d_functional.reduce_scatter_tensor";
constexpr const char* all_to_all_single = "c10d_functional.all_to_all_single";
constexpr const char* broadcast = "c10d_functional.broadcast";
}  // namespace c10d_functional
namespace c10d {
constexpr const char* gather_ = "c10d.gather_";
constexpr const char* scatter_ = "c10d.scatter_";
constexpr const char* send = "c10d.send";
constexpr const char* recv_ = "c10d.recv_";
}  // namespace c10d

using CommCounts = std::map<std::string, int64_t>;

struct ModuleCommCounts {
  CommCounts forward, backward;
  bool operator==(const ModuleCommCounts& o) const { return forward == o.forward && backward == o.backward; }
};

// One collective, as this rank issued it.
struct CollectiveRecord {
  std::string op;               // the count key: "c10d_functional.all_reduce"
  int64_t input_bytes = 0;      // what this rank passed in
  int64_t output_bytes = 0;     // what it received
  int group_size = 0;
  std::vector<int> group_ranks;  // global ranks of the group
  std::vector<std::string> modules;  // the module path, outermost first (empty: outside any)
  bool backward = false;
  // Why it happened: the DTensor op ("aten::mm", "redistribute",
  // "dtensor::RedistributeBackward"), or "" for a collective called directly.
  std::string cause;
  int input_index = -1;          // the op's argument whose placement forced it (-1: none)
  std::string placements_before;  // "(Shard(dim=0), Replicate())"; "" when not a redistribution
  std::string placements_after;
  std::string mesh;
};

struct CommDebugModeOptions {
  bool strict = false;  // raise instead of redistributing implicitly (NOTE: [CommDebugMode])
};

class CommDebugMode {
 public:
  explicit CommDebugMode(CommDebugModeOptions options = {});
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  // Active while alive: collectives on this thread are recorded (RAII for `with comm_mode:`).
  class Active {
   public:
    Active(Active&& o) noexcept : mode_(o.mode_) { o.mode_ = nullptr; }
    Active& operator=(Active&&) = delete;
    ~Active();

   private:
    friend class CommDebugMode;
    explicit Active(CommDebugMode* mode) : mode_(mode) {}
    CommDebugMode* mode_;
  };
  // Clears what was recorded and starts recording on this thread; throws when already active.
  Active enter();
  bool active() const { return active_; }
  bool strict() const { return options_.strict; }

  // PyTorch's API.
  int64_t get_total_counts() const;
  CommCounts get_comm_counts() const { return counts_; }
  // fqn -> counts; "Global" always present.
  const std::map<std::string, ModuleCommCounts>& get_comm_module_counts() const { return module_counts_; }
  // Level 0: counts per module; 1 and up: also each module's type and every collective with
  // its bytes, group, cause and placements (PyTorch's higher levels list every op; only
  // collectives are recorded here).
  std::string generate_comm_debug_tracing_table(int noise_level = 3) const;
  void log_comm_debug_tracing_table_to_file(const std::string& file_name = "comm_mode_log.txt",
                                            int noise_level = 3) const;
  // The tree from "Global" as JSON (fqn, module_type, children, collectives_forward,
  // collectives_backward, and at level 1 and up collectives_detail); written to `file_name`
  // and returned.
  std::string generate_json_dump(const std::string& file_name = "comm_mode_log.json", int noise_level = 3) const;

  // Beyond PyTorch's: every collective in order, and their bytes.
  const std::vector<CollectiveRecord>& get_collectives() const { return records_; }
  int64_t get_total_bytes() const;  // sum of input_bytes

  // Modules seen, in the order first entered (Global first).
  struct ModuleInfo {
    std::string fqn, type, parent;
    int depth = 0;
  };
  const std::vector<ModuleInfo>& get_modules() const { return modules_; }

 private:
  friend struct CommDebugModeAccess;
  void exit();
  void record(CollectiveRecord r);
  void module_entered(const std::string& fqn, const std::string& type, const std::string& parent, int depth);

  CommDebugModeOptions options_;
  bool active_ = false;
  CommDebugMode* previous_ = nullptr;  // the mode active on this thread before this one
  CommCounts counts_;
  std::map<std::string, ModuleCommCounts> module_counts_;
  std::vector<CollectiveRecord> records_;
  std::vector<ModuleInfo> modules_;
};

}  // namespace debug
}  // namespace dtensor
