// dtensor/debug/mem_tracker.cpp: see NOTE: [MemTracker] in mem_tracker.h and NOTE: [Per-rank
// memory accounting] in tracking_allocator_internal.h.
#include "dtensor/debug/mem_tracker.h"

#include "dtensor/debug/tracking_allocator_internal.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/tensor/dtensor.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace dtensor {
namespace debug {

// ---- the accounting allocator ------------------------------------------------------------------
namespace detail {
namespace {
TrackingAllocator* g_allocator = nullptr;
c10::Allocator* g_meta_allocator = nullptr;
thread_local int t_slot = 0;
thread_local int t_use_scope = -1;      // a MemoryUseScope's use; -1: none
thread_local int t_forward_depth = 0;   // tracked modules whose forward is running (the active tracker's)
std::atomic<int> g_trackers_claimed{0};

bool in_backward() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

// The use of a block allocated now, on this thread, in a tracker's slot.
MemoryUse current_use() {
  if (t_use_scope >= 0) return static_cast<MemoryUse>(t_use_scope);
  if (in_backward()) return MemoryUse::kBackward;
  return t_forward_depth > 0 ? MemoryUse::kActivation : MemoryUse::kOther;
}
}  // namespace

MemoryUseScope::MemoryUseScope(MemoryUse use) : saved_(t_use_scope) { t_use_scope = static_cast<int>(use); }
MemoryUseScope::~MemoryUseScope() { t_use_scope = saved_; }

UntrackedScope::UntrackedScope() : saved_(t_slot) {
  if (t_slot > TrackingAllocator::kMaxRanks) t_slot = 0;
}
UntrackedScope::~UntrackedScope() { t_slot = saved_; }

// Meta storages: no data, so the header is a heap block of its own, the DataPtr's context (the
// data pointer stays null, as the meta allocator's). They count for a MemTracker only (a fake
// world on the meta device plans the memory a real rank would use), not for a rank's or the
// default slot, whose figures are the CPU memory a rank really holds.
class MetaTrackingAllocator final : public compat::Allocator {
 public:
  c10::DataPtr do_allocate(size_t n) const override {
    if (t_slot < TrackingAllocator::kMaxRanks + 1) return c10::DataPtr(nullptr, c10::Device(c10::kMeta));
    return c10::DataPtr(nullptr, g_allocator->charge(n, nullptr), &TrackingAllocator::release_meta,
                        c10::Device(c10::kMeta));
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
};

TrackingAllocator& TrackingAllocator::install() {
  static TrackingAllocator* a = [] {
    auto* t = new TrackingAllocator(c10::GetCPUAllocator());
    g_allocator = t;
    c10::SetCPUAllocator(t, /*priority=*/100);
    g_meta_allocator = new MetaTrackingAllocator();
    c10::SetAllocator(c10::kMeta, g_meta_allocator, /*priority=*/100);
    return t;
  }();
  return *a;
}

const c10::Allocator* TrackingAllocator::meta() {
  install();
  return g_meta_allocator;
}

void TrackingAllocator::set_slot(int s) {
  TORCH_CHECK(s >= 0 && s <= kMaxRanks, "TrackingAllocator: slot ", s, " is out of range [0, ", kMaxRanks + 1,
              "): slot 0 and one per rank, for ranks 0 to ", kMaxRanks - 1);
  t_slot = s;
}
int TrackingAllocator::get_slot() { return t_slot; }
void TrackingAllocator::use_slot(int s) { t_slot = checked(s); }

int TrackingAllocator::claim_tracker_slot() {
  const int n = g_trackers_claimed.fetch_add(1);
  TORCH_CHECK(n < kMaxTrackers, "MemTracker: a process makes at most ", kMaxTrackers,
              " trackers (each keeps its own counters for the process's life); this would be tracker ", n + 1);
  return kFirstTrackerSlot + n;
}

int TrackingAllocator::checked(int s) {
  TORCH_CHECK(s >= 0 && s < kSlots, "TrackingAllocator: slot ", s, " is out of range [0, ", kSlots,
              "): slot 0, one per rank (ranks 0 to ", kMaxRanks - 1, ") and one per MemTracker");
  return s;
}
int TrackingAllocator::checked_tracker(int s) {
  TORCH_CHECK(checked(s) >= kFirstTrackerSlot, "TrackingAllocator: slot ", s, " is not a MemTracker's");
  return s - kFirstTrackerSlot;
}

void TrackingAllocator::snapshot_at_peak(int s) const {
  TrackerCounters& t = trackers_[s - kFirstTrackerSlot];
  for (int u = 0; u < kMemoryUses; ++u) t.at_peak[u].store(t.current[u].load());
}

void TrackingAllocator::reset_peak(int s) {
  peak_[checked(s)].store(current_[s].load());
  if (s >= kFirstTrackerSlot) snapshot_at_peak(s);
}

MemoryUseBytes TrackingAllocator::current_by_use(int s) const {
  const TrackerCounters& t = trackers_[checked_tracker(s)];
  MemoryUseBytes b{};
  for (int u = 0; u < kMemoryUses; ++u) b[u] = t.current[u].load();
  return b;
}
MemoryUseBytes TrackingAllocator::peak_by_use(int s) const {
  const TrackerCounters& t = trackers_[checked_tracker(s)];
  MemoryUseBytes b{};
  for (int u = 0; u < kMemoryUses; ++u) b[u] = t.at_peak[u].load();
  return b;
}
int64_t TrackingAllocator::window_peak(int s) const { return trackers_[checked_tracker(s)].window_peak.load(); }
void TrackingAllocator::set_window_peak(int s, int64_t bytes) { trackers_[checked_tracker(s)].window_peak.store(bytes); }

TrackingAllocator::Header* TrackingAllocator::charge(size_t n, void* at) const {
  auto* h = at != nullptr ? new (at) Header : new Header;
  h->bytes = static_cast<int64_t>(n);
  h->slot = t_slot;
  const bool tracker = h->slot >= kFirstTrackerSlot;
  h->use = static_cast<uint8_t>(tracker ? current_use() : MemoryUse::kOther);
  if (tracker) trackers_[h->slot - kFirstTrackerSlot].current[h->use].fetch_add(h->bytes);
  const int64_t now = current_[h->slot].fetch_add(h->bytes) + h->bytes;
  if (raise(peak_[h->slot], now) && tracker) snapshot_at_peak(h->slot);
  if (tracker) raise(trackers_[h->slot - kFirstTrackerSlot].window_peak, now);
  return h;
}

void TrackingAllocator::refund(const Header* h) {
  if (h->slot >= kFirstTrackerSlot) g_allocator->trackers_[h->slot - kFirstTrackerSlot].current[h->use].fetch_sub(h->bytes);
  g_allocator->current_[h->slot].fetch_sub(h->bytes);
}

c10::DataPtr TrackingAllocator::do_allocate(size_t n) const {
  static_assert(sizeof(Header) <= kHeader, "the header must fit before the block");
  auto* raw = static_cast<char*>(inner_->raw_allocate(n + kHeader));
  charge(n, raw);
  void* data = raw + kHeader;
  return c10::DataPtr(data, data, &TrackingAllocator::release, c10::Device(c10::kCPU));
}

void TrackingAllocator::release(void* data) {
  if (data == nullptr) return;
  char* raw = static_cast<char*>(data) - kHeader;
  refund(reinterpret_cast<Header*>(raw));
  g_allocator->inner_->raw_deallocate(raw);
}

void TrackingAllocator::release_meta(void* header) {
  if (header == nullptr) return;
  auto* h = static_cast<Header*>(header);
  refund(h);
  delete h;
}
}  // namespace detail

// ---- MemTracker ---------------------------------------------------------------------------------
using detail::TrackingAllocator;

namespace {
thread_local MemTracker* t_active = nullptr;

// A tensor's storage: its address and size (a DTensor by its local tensor's).
void add_storage(const at::Tensor& t, std::unordered_set<const void*>& seen, int64_t& bytes) {
  if (!t.defined()) return;
  const at::Tensor& local = is_dtensor(t) ? local_tensor(t) : t;
  if (!local.defined() || !local.has_storage()) return;
  const c10::Storage& s = local.storage();
  const void* key = s.unsafeGetStorageImpl();
  if (!seen.insert(key).second) return;
  bytes += static_cast<int64_t>(s.nbytes());
}

// Adam's and AdamW's state: the two moments (and the max of the second, with amsgrad).
template <class S>
bool add_moments(const torch::optim::OptimizerParamState& st, std::unordered_set<const void*>& seen, int64_t& bytes) {
  const auto* s = dynamic_cast<const S*>(&st);
  if (s == nullptr) return false;
  add_storage(s->exp_avg(), seen, bytes);
  add_storage(s->exp_avg_sq(), seen, bytes);
  add_storage(s->max_exp_avg_sq(), seen, bytes);
  return true;
}

// Adds the optimizer's state tensors; false for an optimizer whose state kind is not known.
bool add_optimizer_state(const torch::optim::OptimizerParamState& st, std::unordered_set<const void*>& seen,
                         int64_t& bytes) {
  using namespace torch::optim;
  if (add_moments<AdamParamState>(st, seen, bytes) || add_moments<AdamWParamState>(st, seen, bytes)) return true;
  if (const auto* s = dynamic_cast<const SGDParamState*>(&st)) {
    add_storage(s->momentum_buffer(), seen, bytes);
    return true;
  }
  if (const auto* s = dynamic_cast<const RMSpropParamState*>(&st)) {
    add_storage(s->square_avg(), seen, bytes);
    add_storage(s->momentum_buffer(), seen, bytes);
    add_storage(s->grad_avg(), seen, bytes);
    return true;
  }
  if (const auto* s = dynamic_cast<const AdagradParamState*>(&st)) {
    add_storage(s->sum(), seen, bytes);
    return true;
  }
  return false;
}

std::string optimizer_class(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<const torch::optim::RMSprop*>(&o)) return "RMSprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(&o)) return "Adagrad";
  return c10::demangle(typeid(o).name());
}
}  // namespace

struct MemTracker::State {
  int slot = -1;
  int saved_slot = 0;
  std::vector<std::shared_ptr<torch::nn::Module>> roots;
  std::vector<const torch::optim::Optimizer*> optimizers;
  std::vector<nn::RemovableHandle> hooks;
  // Per tracked module: its fqn and depth (its figures are in `stats`, by first call).
  struct Tracked {
    std::string fqn;
    int depth = 0;
  };
  std::unordered_map<const torch::nn::Module*, Tracked> modules;
  std::vector<ModuleMemoryStats> stats;  // first-call order
  std::unordered_map<const torch::nn::Module*, size_t> stats_index;
  // Modules whose forward is running on the entered thread, with the enclosing window's peak
  // when each began (restored, raised by the inner one's, when it returns).
  struct Open {
    size_t index;
    int64_t outer_peak;
  };
  std::vector<Open> open;

  // Backward (NOTE: [Per-module backward]). The hooks on gradients reach the tracker through
  // `self` (null once it is destroyed) and act only in the scope that registered them.
  std::shared_ptr<State*> self;
  MemTracker* owner = nullptr;
  uint64_t scope = 0;  // enter() counts them
  // kEndedFirst: its inputs' gradients came before its outputs' (a module that returns its
  // input, as dropout with p = 0 does: both hooks are on one tensor, the input's first).
  enum class Backward : uint8_t { kNone, kOpen, kEnded, kEndedFirst };
  std::vector<Backward> backward;              // by stats index, in the current backward
  std::vector<bool> first_backward_ended;     // by stats index: its post_backward is set
  std::vector<std::pair<size_t, int64_t>> open_backward;  // (stats index, its peak so far)
  bool end_queued = false;

  bool active() const { return t_active == owner; }
  void begin_backward(size_t index);
  void end_backward(size_t index);
  void end_of_backward();
  void queue_end_of_backward(bool requeue);
  // Raises every open module's peak to the window's, and starts a new window.
  void fold_window();
  void hook_outputs(const c10::IValue& v, size_t index);
  void hook_inputs(nn::ForwardInputs& inputs, size_t index);
};

// NOTE: [Per-module backward]
// A module's backward, as PyTorch's ModTracker delimits it, begins when the gradient of one of
// its outputs is computed (a hook on each output, registered by the forward hook) and ends
// when the gradients of all its inputs that need one are (a hook on each, registered by the
// forward pre-hook; a tensor's hook fires once its gradient is complete, all uses summed). A
// module none of whose inputs needs a gradient (the root taking tokens, an embedding) ends with
// the backward (a callback queued on the autograd engine). Backwards do not nest as calls do
// (a block's backward begins on the same gradient that ends the next block's), so the peak is
// not kept by a stack: at every begin and end, the window's peak since the last one is folded
// into every open module's, and a new window starts. The hooks change no gradient.

void MemTracker::State::fold_window() {
  auto& mem = TrackingAllocator::install();
  const int64_t peak = mem.window_peak(slot);
  for (auto& [index, p] : open_backward) p = std::max(p, peak);
  mem.set_window_peak(slot, mem.current(slot));
}

void MemTracker::State::begin_backward(size_t index) {
  if (index >= stats.size()) return;
  if (backward.size() < stats.size()) backward.resize(stats.size(), Backward::kNone);
  if (backward[index] != Backward::kNone && backward[index] != Backward::kEndedFirst) return;
  const bool ended_first = backward[index] == Backward::kEndedFirst;
  backward[index] = Backward::kOpen;
  fold_window();
  const int64_t now = TrackingAllocator::install().current(slot);
  ModuleMemoryStats& ms = stats[index];
  if (!ms.backward) {
    ms.backward = true;
    ms.pre_backward = now;
  }
  open_backward.emplace_back(index, now);
  if (ended_first) {
    end_backward(index);  // an empty backward
    return;
  }
  if (!end_queued) {
    end_queued = true;
    queue_end_of_backward(/*requeue=*/true);
  }
}

// The engine runs its callbacks in the order queued, those queued while they run included: the
// first run queues the end again, so that it comes after every callback queued before it runs
// (fully_shard's, which reduce-scatters the root's gradients and waits for that).
void MemTracker::State::queue_end_of_backward(bool requeue) {
  std::weak_ptr<State*> weak = self;
  const uint64_t registered = scope;
  torch::autograd::Engine::get_default_engine().queue_callback([weak, registered, requeue] {
    auto s = weak.lock();
    if (!s || (*s)->scope != registered || !(*s)->active()) return;
    if (requeue) {
      (*s)->queue_end_of_backward(/*requeue=*/false);
    } else {
      (*s)->end_of_backward();
    }
  });
}

void MemTracker::State::end_backward(size_t index) {
  if (index >= stats.size()) return;
  if (backward.size() < stats.size()) backward.resize(stats.size(), Backward::kNone);
  if (backward[index] == Backward::kNone) {
    backward[index] = Backward::kEndedFirst;  // for this backward only: reset at its end
    if (!end_queued) {
      end_queued = true;
      queue_end_of_backward(/*requeue=*/true);
    }
  }
  if (backward[index] != Backward::kOpen) return;
  fold_window();
  auto it = std::find_if(open_backward.begin(), open_backward.end(), [&](const auto& o) { return o.first == index; });
  ModuleMemoryStats& ms = stats[index];
  ms.peak_backward = std::max(ms.peak_backward, it->second);
  // The figures are the first backward's; the peak is any's.
  if (first_backward_ended.size() < stats.size()) first_backward_ended.resize(stats.size(), false);
  if (!first_backward_ended[index]) {
    first_backward_ended[index] = true;
    ms.post_backward = TrackingAllocator::install().current(slot);
  }
  open_backward.erase(it);
  backward[index] = Backward::kEnded;
}

void MemTracker::State::end_of_backward() {
  while (!open_backward.empty()) end_backward(open_backward.back().first);
  std::fill(backward.begin(), backward.end(), Backward::kNone);
  end_queued = false;
}

void MemTracker::State::hook_outputs(const c10::IValue& v, size_t index) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.requires_grad()) return;
    std::weak_ptr<State*> weak = self;
    const uint64_t registered = scope;
    t.register_hook([weak, registered, index](const at::Tensor&) {
      auto s = weak.lock();
      if (s && (*s)->scope == registered && (*s)->active()) (*s)->begin_backward(index);
    });
  } else if (v.isTensorList() || v.isList() || v.isTuple()) {
    const std::vector<c10::IValue> elements = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
    for (const auto& e : elements) hook_outputs(e, index);
  }
}

void MemTracker::State::hook_inputs(nn::ForwardInputs& inputs, size_t index) {
  std::vector<at::Tensor> needing;
  for (const auto& in : inputs) {
    if (in.isTensor() && in.toTensor().defined() && in.toTensor().requires_grad()) needing.push_back(in.toTensor());
  }
  if (needing.empty()) return;
  // The module's backward ends when every one of them has its gradient.
  auto left = std::make_shared<size_t>(needing.size());
  std::weak_ptr<State*> weak = self;
  const uint64_t registered = scope;
  for (auto& t : needing) {
    t.register_hook([weak, registered, index, left](const at::Tensor&) {
      auto s = weak.lock();
      if (!s || (*s)->scope != registered || !(*s)->active()) return;
      if (*left > 0 && --*left == 0) (*s)->end_backward(index);
    });
  }
}

MemTracker::MemTracker() : state_(std::make_unique<State>()) {
  TrackingAllocator::install();
  state_->slot = TrackingAllocator::claim_tracker_slot();
  state_->self = std::make_shared<State*>(state_.get());
  state_->owner = this;
}

MemTracker::~MemTracker() {
  for (auto& h : state_->hooks) h.remove();
  state_->self.reset();  // the hooks on gradients find no tracker
  if (active_) exit();
}

void MemTracker::track_external(torch::nn::Module& module) {
  std::shared_ptr<torch::nn::Module> root;
  try {
    root = module.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    TORCH_CHECK(false, "MemTracker::track_external: the ", nn::detail::module_type_name(module),
                " module is not owned by a std::shared_ptr (use a ModuleHolder or std::make_shared)");
  }
  const std::string root_name = nn::detail::module_type_name(module);
  // A storage keeps the allocator it was made with and re-allocates through it (fully_shard's
  // unshard resizes its parameters' storages): one made before the accounting was installed
  // would be missed, silently.
  const c10::Allocator* accounting = &TrackingAllocator::install();
  auto check_allocator = [&](const std::string& kind, const std::string& name, const at::Tensor& t) {
    if (!t.defined()) return;
    const at::Tensor& local = is_dtensor(t) ? local_tensor(t) : t;
    if (!local.has_storage() || local.storage().nbytes() == 0) return;
    if (local.device().type() != c10::kCPU && local.device().type() != c10::kMeta) return;
    const c10::Allocator* expected = local.is_meta() ? TrackingAllocator::meta() : accounting;
    TORCH_CHECK(local.storage().allocator() == expected, "MemTracker::track_external: ", kind, " ", root_name,
                name.empty() ? "" : ".", name,
                " was allocated before the memory accounting was installed, and storages re-allocate through the "
                "allocator they were made with (fully_shard's unshard does), so its memory would be missed: make "
                "the MemTracker before building the model");
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) check_allocator("parameter", p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) check_allocator("buffer", b.key(), b.value());
  State& st = *state_;
  st.roots.push_back(root);
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    torch::nn::Module* m = item.value().get();
    if (st.modules.count(m)) continue;
    const std::string& key = item.key();
    State::Tracked t;
    t.fqn = key.empty() ? root_name : root_name + "." + key;
    t.depth = key.empty() ? 0 : static_cast<int>(std::count(key.begin(), key.end(), '.')) + 1;
    st.modules.emplace(m, t);
    st.hooks.push_back(nn::register_forward_pre_hook(*m, [this](torch::nn::Module& mod, nn::ForwardInputs& inputs) {
      if (t_active != this) return;
      State& s = *state_;
      auto& mem = TrackingAllocator::install();
      auto it = s.stats_index.find(&mod);
      if (it == s.stats_index.end()) {
        const State::Tracked& tr = s.modules.at(&mod);
        ModuleMemoryStats ms;
        ms.fqn = tr.fqn;
        ms.depth = tr.depth;
        ms.pre_forward = mem.current(s.slot);
        it = s.stats_index.emplace(&mod, s.stats.size()).first;
        s.stats.push_back(ms);
      }
      ++s.stats[it->second].calls;
      if (at::GradMode::is_enabled()) s.hook_inputs(inputs, it->second);
      s.open.push_back({it->second, mem.window_peak(s.slot)});
      mem.set_window_peak(s.slot, mem.current(s.slot));
      ++detail::t_forward_depth;
    }));
    st.hooks.push_back(
        nn::register_forward_hook(*m, [this](torch::nn::Module& mod, const nn::ForwardInputs&, c10::IValue& output) {
          if (t_active != this) return;
          State& s = *state_;
          if (s.open.empty()) return;
          auto& mem = TrackingAllocator::install();
          const State::Open o = s.open.back();
          s.open.pop_back();
          if (detail::t_forward_depth > 0) --detail::t_forward_depth;
          ModuleMemoryStats& ms = s.stats[o.index];
          const int64_t peak = mem.window_peak(s.slot);
          ms.peak_forward = std::max(ms.peak_forward, peak);
          if (ms.calls == 1) ms.post_forward = mem.current(s.slot);
          mem.set_window_peak(s.slot, std::max(o.outer_peak, peak));
          if (at::GradMode::is_enabled()) s.hook_outputs(output, o.index);
          (void)mod;
        }));
  }
}

void MemTracker::track_external(const torch::optim::Optimizer& optimizer) {
  for (const auto& item : optimizer.state()) {
    std::unordered_set<const void*> seen;
    int64_t bytes = 0;
    TORCH_CHECK(add_optimizer_state(*item.second, seen, bytes), "MemTracker::track_external: the state of ",
                optimizer_class(optimizer),
                " is not known (Adam, AdamW, SGD, RMSprop and Adagrad are); its memory is counted in current() only");
  }
  state_->optimizers.push_back(&optimizer);
}

MemTracker::Active::~Active() {
  if (tracker_ != nullptr) tracker_->exit();
}

MemTracker::Active MemTracker::enter() {
  TORCH_CHECK(!active_, "MemTracker::enter: this tracker is already active");
  TORCH_CHECK(t_active == nullptr, "MemTracker::enter: another MemTracker is active on this thread (one at a time)");
  TrackingAllocator::install();
  State& st = *state_;
  st.stats.clear();
  st.stats_index.clear();
  st.open.clear();
  ++st.scope;
  st.backward.clear();
  st.first_backward_ended.clear();
  st.open_backward.clear();
  st.end_queued = false;
  st.saved_slot = TrackingAllocator::get_slot();
  TrackingAllocator::use_slot(st.slot);
  auto& mem = TrackingAllocator::install();
  mem.reset_peak(st.slot);
  mem.set_window_peak(st.slot, mem.current(st.slot));
  detail::t_forward_depth = 0;
  t_active = this;
  active_ = true;
  return Active(this);
}

void MemTracker::exit() {
  if (!active_) return;
  TrackingAllocator::use_slot(state_->saved_slot);
  detail::t_forward_depth = 0;
  t_active = nullptr;
  active_ = false;
  state_->open.clear();
  state_->open_backward.clear();
}

namespace {
MemoryByUse by_use(const detail::MemoryUseBytes& b) {
  using detail::MemoryUse;
  MemoryByUse m;
  m.activations = b[static_cast<int>(MemoryUse::kActivation)];
  m.backward = b[static_cast<int>(MemoryUse::kBackward)];
  m.unsharded_parameters = b[static_cast<int>(MemoryUse::kUnshardedParameter)];
  m.all_gather_buffers = b[static_cast<int>(MemoryUse::kAllGather)];
  m.reduce_scatter_buffers = b[static_cast<int>(MemoryUse::kReduceScatter)];
  m.other = b[static_cast<int>(MemoryUse::kOther)];
  return m;
}
}  // namespace

MemoryByUse MemTracker::current_by_use() const { return by_use(TrackingAllocator::install().current_by_use(state_->slot)); }
MemoryByUse MemTracker::peak_by_use() const { return by_use(TrackingAllocator::install().peak_by_use(state_->slot)); }
int64_t MemTracker::current() const { return TrackingAllocator::install().current(state_->slot); }
int64_t MemTracker::peak() const { return TrackingAllocator::install().peak(state_->slot); }
void MemTracker::reset_peak() { TrackingAllocator::install().reset_peak(state_->slot); }

HeldMemory MemTracker::held() const {
  HeldMemory h;
  std::unordered_set<const void*> seen;
  // Parameters before gradients and buffers: a storage shared by two kinds counts as the first.
  for (const auto& root : state_->roots)
    for (const auto& p : root->parameters(/*recurse=*/true)) add_storage(p, seen, h.parameters);
  for (const auto& root : state_->roots)
    for (const auto& b : root->buffers(/*recurse=*/true)) add_storage(b, seen, h.buffers);
  for (const auto& root : state_->roots)
    for (const auto& p : root->parameters(/*recurse=*/true)) add_storage(p.grad(), seen, h.gradients);
  for (const auto* opt : state_->optimizers)
    for (const auto& item : opt->state()) {
      TORCH_CHECK(add_optimizer_state(*item.second, seen, h.optimizer_state), "MemTracker::held: the state of ",
                  optimizer_class(*opt), " is not known (Adam, AdamW, SGD, RMSprop and Adagrad are)");
    }
  return h;
}

std::vector<ModuleMemoryStats> MemTracker::module_stats() const { return state_->stats; }

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  const bool negative = b < 0;
  if (negative) b = -b;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%s%.0f %s" : "%s%.2f %s", negative ? "-" : "", b, units[u]);
  return buf;
}

std::string MemTracker::display_modulewise_stats() const {
  size_t width = std::string("module (forward)").size();
  for (const auto& m : state_->stats) width = std::max(width, 2 * m.depth + m.fqn.size());
  std::ostringstream os;
  char line[512];
  const int w = static_cast<int>(width);
  std::snprintf(line, sizeof line, "%-*s %6s %12s %12s %12s %12s\n", w, "module (forward)", "calls", "pre", "post",
                "post - pre", "peak");
  os << line;
  for (const auto& m : state_->stats) {
    const std::string name = std::string(2 * m.depth, ' ') + m.fqn;
    std::snprintf(line, sizeof line, "%-*s %6lld %12s %12s %12s %12s\n", w, name.c_str(), (long long)m.calls,
                  format_bytes(m.pre_forward).c_str(), format_bytes(m.post_forward).c_str(),
                  format_bytes(m.post_forward - m.pre_forward).c_str(), format_bytes(m.peak_forward).c_str());
    os << line;
  }
  bool any_backward = false;
  for (const auto& m : state_->stats) any_backward = any_backward || m.backward;
  if (!any_backward) return os.str();
  std::snprintf(line, sizeof line, "\n%-*s %12s %12s %12s %12s\n", w, "module (backward)", "pre", "post", "post - pre",
                "peak");
  os << line;
  for (const auto& m : state_->stats) {
    if (!m.backward) continue;
    const std::string name = std::string(2 * m.depth, ' ') + m.fqn;
    std::snprintf(line, sizeof line, "%-*s %12s %12s %12s %12s\n", w, name.c_str(), format_bytes(m.pre_backward).c_str(),
                  format_bytes(m.post_backward).c_str(), format_bytes(m.post_backward - m.pre_backward).c_str(),
                  format_bytes(m.peak_backward).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace debug
}  // namespace dtensor
