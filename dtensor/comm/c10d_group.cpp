// dtensor/comm/c10d_group.cpp
#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/group_checks_internal.h"

#include "dtensor/comm/abort.h"
#include "dtensor/comm/trace.h"

#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/device.h"
#include "dtensor/comm/gloo_loop_ticker_internal.h"
#include "dtensor/compat.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef DTENSOR_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
// USE_C10D_MPI: libtorch was built with MPI; DTENSOR_WITH_MPI: CMake found MPI to build
// against (see CMakeLists.txt). The mpi backend needs both.
#if defined(USE_C10D_MPI) && defined(DTENSOR_WITH_MPI)
#define DTENSOR_MPI_BACKEND 1
#include <torch/csrc/distributed/c10d/ProcessGroupMPI.hpp>
#endif


#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace dtensor {
namespace comm {

namespace {

// c10d's Backend split: in libtorch 2.x the Gloo/NCCL/MPI objects are c10d::Backends (a
// c10d::ProcessGroup is a dispatcher over them); in 1.13 they are c10d::ProcessGroups. The
// adapter only calls the collectives both classes declare, on whichever class the backend is.
#if DTENSOR_TORCH_2
using BackendPg = c10d::Backend;
#else
using BackendPg = c10d::ProcessGroup;
#endif

bool one_backend_available(const std::string& name, std::string* why) {
  auto fail = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (name == "gloo") return true;
  if (name == "nccl") {
#ifdef DTENSOR_WITH_NCCL
    return true;
#else
    return fail("backend nccl needs a CUDA build of libtorch; this dtensor-cpp was built against a "
                "CPU-only libtorch");
#endif
  }
  if (name == "mpi") {
#if defined(DTENSOR_MPI_BACKEND)
    return true;
#elif defined(USE_C10D_MPI)
    return fail("backend mpi: this libtorch was built with MPI, but dtensor-cpp was built without MPI's "
                "headers and library (install e.g. libopenmpi-dev and rebuild)");
#else
    return fail("backend mpi needs a libtorch built with MPI (USE_C10D_MPI); this one was not");
#endif
  }
  return fail("unknown backend '" + name + "': expected gloo, nccl or mpi");
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return c10d::ReduceOp::SUM;
    case ReduceOp::PRODUCT: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

bool backend_available(const std::string& backend, std::string* why) {
  std::vector<detail::BackendEntry> parts;
  try {
    parts = detail::parse_backend(backend);
  } catch (const c10::Error& e) {
    if (why) *why = e.what_without_backtrace();
    return false;
  }
  for (auto& e : parts)
    if (!one_backend_available(e.backend, why)) return false;
  return true;
}

struct C10dGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0, size = 1;
  C10dGroupOptions options;
  std::vector<int> global_ranks;
  // One process group per entry of the backend spec, in its order.
  std::vector<detail::BackendEntry> entries;
  // Declared before pgs: the process groups are destroyed first (NOTE: [Gloo's loop ticks]).
  std::vector<std::unique_ptr<LoopTicker>> tickers;
  std::vector<c10::intrusive_ptr<BackendPg>> pgs;
  uint64_t subgroups_created = 0;
  // A wait on this group was aborted (NOTE: [Aborting waits]): a backend thread may be
  // blocked in that operation, and destroying the process group would join it.
  std::shared_ptr<std::atomic<bool>> poisoned = std::make_shared<std::atomic<bool>>(false);

  // Where the collective on `t` runs (NOTE: [Backend routing]).
  struct Target {
    BackendPg* pg = nullptr;
    detail::NativeCollectives native;
    std::optional<at::Device> stage;  // copy to this device, run, copy back
  };
  Target target(const at::Tensor& t) {
    const std::string dev = c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
    const detail::BackendRoute r = detail::route_tensor(options.backend, entries, dev);
    Target tg;
    tg.pg = pgs[r.entry].get();
    tg.native = detail::native_collectives(entries[r.entry].backend);
    if (r.stage_through_cuda) tg.stage = rank_device("cuda", "backend " + options.backend);
    if (r.stage_through_host) tg.stage = at::Device(at::kCPU);
    return tg;
  }
  BackendPg& default_pg() { return *pgs[0]; }
};

// `ticker`: set for a Gloo group (NOTE: [Gloo's loop ticks]).
static c10::intrusive_ptr<BackendPg> make_pg(const std::string& name,
                                                      const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      const C10dGroupOptions& o,
                                                      std::unique_ptr<LoopTicker>* ticker) {
  std::string why;
  TORCH_CHECK(one_backend_available(name, &why), why);
  if (name == "gloo") {
    std::string host = o.gloo_hostname;
    if (host.empty()) {
      if (const char* h = std::getenv("DTENSOR_GLOO_HOSTNAME")) host = h;
    }
    auto device = host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                               : c10d::ProcessGroupGloo::createDeviceForHostname(host);
    *ticker = LoopTicker::attach(device);  // destroyed after `opts` should connecting fail
    auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
    opts->devices.push_back(std::move(device));
    opts->threads = 1;
    if (*ticker) (*ticker)->start();
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    if (*ticker) (*ticker)->stop();
    return pg;
  }
#ifdef DTENSOR_WITH_NCCL
  if (name == "nccl") {
    // One GPU per rank (NOTE: [Rank devices]): init_process_group and the harness made the
    // rank's device current; NCCL's communicators and barriers use the current device.
    (void)rank_device("cuda", "backend nccl");
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = o.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  }
#endif
#ifdef DTENSOR_MPI_BACKEND
  if (name == "mpi") return c10d::ProcessGroupMPI::createProcessGroupMPI({});
#endif
  TORCH_CHECK(false, "backend ", name, " is not available");
}

// NOTE: [Group creation completes on every rank]
// Gloo's full-mesh connect returns on a rank once its own pairs are connected, while a peer
// may still be reading the handshake of one of them: a rank that went on (and exited, or
// started using the group) broke that peer's connect ("Connection closed by peer"), ~30% of
// tests in which every rank skipped and ~1 in 20 mesh creations here. As PyTorch's new_group
// does (_store_based_barrier), no rank leaves create() before every rank has finished its
// connect: each arrival is counted in the store and the last one opens the gate (keys are
// numbered by generation, so a store can serve several groups in turn). DESIGN.md D12.
static void creation_barrier(c10d::Store& store, int size, std::chrono::milliseconds timeout) {
  if (size <= 1) return;
  const int64_t arrived = store.add("dtensor_group_ready_count", 1);
  const std::string gate = "dtensor_group_ready_" + std::to_string((arrived - 1) / size);
  // The last to arrive also waits (one round trip): its set is then processed, and the
  // others woken, before it can go on (and, say, crash, taking the store's host with it).
  if (arrived % size == 0) store.set(gate, std::vector<uint8_t>{1});
  store.wait({gate}, timeout);
}

C10dGroup::C10dGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
C10dGroup::~C10dGroup() {
  if (!impl_) return;
  if (*impl_->poisoned) {
    for (auto& pg : impl_->pgs) (void)pg.release();  // leaked on purpose (Impl::poisoned)
    for (auto& t : impl_->tickers) (void)t.release();  // their loops live on
    return;
  }
  for (auto& t : impl_->tickers)
    if (t) t->start();  // closing the pairs waits for loop ticks (NOTE: [Gloo's loop ticks])
  impl_->pgs.clear();
  impl_->tickers.clear();
}

std::shared_ptr<C10dGroup> C10dGroup::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                             int size, const C10dGroupOptions& options) {
  TORCH_CHECK(store, "C10dGroup::create: store is null");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "C10dGroup::create: rank ", rank,
              " is out of range for world size ", size);
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->rank = rank;
  impl->size = size;
  impl->options = options;
  for (int r = 0; r < size; ++r) impl->global_ranks.push_back(r);
  impl->entries = detail::parse_backend(options.backend);
  trace_event("group.connect", rank);
  for (auto& e : impl->entries) {
    c10::intrusive_ptr<c10d::Store> sub = store;
    if (impl->entries.size() > 1) sub = c10::make_intrusive<c10d::PrefixStore>("backend_" + e.backend, store);
    impl->tickers.emplace_back();
    impl->pgs.push_back(make_pg(e.backend, sub, rank, size, options, &impl->tickers.back()));
  }
  trace_event("group.connected", rank);
  creation_barrier(*store, size, options.timeout);
  trace_event("group.ready", rank);
  return std::shared_ptr<C10dGroup>(new C10dGroup(std::move(impl)));
}

int C10dGroup::rank() const { return impl_->rank; }
int C10dGroup::size() const { return impl_->size; }
std::string C10dGroup::backend() const { return impl_->options.backend; }
const std::vector<int>& C10dGroup::global_ranks() const { return impl_->global_ranks; }

namespace {

constexpr std::chrono::milliseconds kAbortSlice{20};  // NOTE: [Aborting waits] (abort.h)

std::string error_text(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

// A c10d operation as a Work source: waits in slices while waits are abortable, turns c10d and
// backend failures into CollectiveError naming the op and the group, and records when the
// backend completed it (through the operation's future, where the backend has one: c10d's
// works keep no completion time, and the Work would otherwise see the completion only when it
// is next waited for or queried, possibly much later). The callback's timestamp lives in a
// shared block because an aborted wait may drop this source while the operation is pending.
class C10dSource final : public Work::Source {
 public:
  // `sliceable`: false for point-to-point operations, whose waits are never sliced (NOTE:
  // [Point-to-point waits are whole]).
  C10dSource(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<std::atomic<bool>> poisoned, const char* op,
             GroupName where, bool sliceable)
      : work_(std::move(work)),
        poisoned_(std::move(poisoned)),
        op_(op),
        where_(std::move(where)),
        sliceable_(sliceable) {
    try {
      auto done = done_at_;
      work_->getFuture()->addCallback([done](c10::ivalue::Future&) {
        done->store(Work::Clock::now().time_since_epoch().count());
      });
    } catch (const std::exception&) {
      // No future for this backend's work: the Work records when it saw the completion.
    }
  }

  bool wait_until(Work::Clock::time_point deadline) override {
    for (;;) {
      if (waits_abortable()) {
        if (auto why = waits_aborted()) {
          *poisoned_ = true;  // the operation stays pending in the backend (~C10dGroup)
          error_ = std::make_exception_ptr(CollectiveError(what() + " aborted: " + *why));
          return true;
        }
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Work::Clock::now());
      const auto slice = sliceable_ && waits_abortable() ? std::min(left, kAbortSlice) : left;
      try {
        work_->wait(std::max(std::chrono::milliseconds(1), slice));
        return true;
      } catch (const std::exception&) {
        // A slice that ended without completion is no error until the deadline. The operation
        // may also have completed just after the slice ended: wait again for its own outcome
        // (success, or its error), never reporting the slice's timeout as its failure.
        if (work_->isCompleted()) {
          try {
            work_->wait(kAbortSlice);
          } catch (const std::exception& e) {
            error_ = std::make_exception_ptr(CollectiveError(what() + " failed: " + error_text(e)));
          }
          return true;
        }
        if (left <= slice) return false;
      }
    }
  }
  bool is_completed() override { return error_ != nullptr || work_->isCompleted(); }
  std::exception_ptr error() override { return error_; }
  std::optional<Work::Clock::time_point> completed_at() override {
    const int64_t t = done_at_->load();
    if (t == 0) return std::nullopt;
    return Work::Clock::time_point(Work::Clock::duration(t));
  }

 private:
  // "<op> on <group>", for errors only.
  std::string what() const { return std::string(op_) + " on " + *where_; }

  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_ptr<std::atomic<bool>> poisoned_;
  bool sliceable_;
  const char* op_;
  GroupName where_;
  std::exception_ptr error_;
  std::shared_ptr<std::atomic<int64_t>> done_at_ = std::make_shared<std::atomic<int64_t>>(0);
};

using Target = C10dGroup::Impl::Target;

// The tensor a backend is given for `t`: dense and contiguous (Gloo and NCCL need that), on
// the staging device when the route has one (NOTE: [Backend routing]). `t` itself when it
// already qualifies.
at::Tensor for_backend(const at::Tensor& t, const Target& tg) {
  at::Tensor x = tg.stage ? t.to(*tg.stage) : t;
  return x.is_contiguous() ? x : x.contiguous();
}

// Finish step that copies a backend's result back into the caller's tensor when the backend
// was given a copy (then `then` runs on the caller's tensor), or just runs `then`.
std::function<void()> copy_back(at::Tensor dst, at::Tensor src, std::function<void(at::Tensor&)> then = nullptr) {
  if (src.is_same(dst) && !then) return nullptr;
  return [dst, src, then]() mutable {
    if (!src.is_same(dst)) dst.copy_(src);
    if (then) then(dst);
  };
}

}  // namespace

namespace {

// NOTE: [Point-to-point waits are whole]
// Abortable waits (NOTE: [Aborting waits]) wait in slices of kAbortSlice, which is harmless for
// collectives: a c10d collective's timed wait only waits. A Gloo send or recv waits on Gloo's
// unbound buffer, whose timed wait closes the connection when it expires ("Application timeout
// caused pair closure"): a recv whose sender came one slice late failed, and with it every later
// operation of the group. Point-to-point operations therefore wait whole, up to their deadline;
// an abort ends them only after that.
// The Work of a c10d operation issued on `g` (named by g.name(): nothing is formatted here).
WorkPtr issue(const C10dGroup& g, const C10dGroup::Impl& impl, const char* op, c10::intrusive_ptr<c10d::Work> work,
              std::function<void()> finish, bool point_to_point = false) {
  auto source = std::make_unique<C10dSource>(std::move(work), impl.poisoned, op, g.name(), !point_to_point);
  return std::make_shared<Work>(op, g.name(), std::move(source), std::move(finish), impl.options.timeout);
}

}  // namespace

WorkPtr C10dGroup::all_reduce_async(const at::Tensor& tensor, ReduceOp op) {
  const detail::ObservedCollective observed(*this, "all_reduce", detail::nbytes(tensor), detail::nbytes(tensor));
  at::Tensor t = tensor;
  if (guard::all_reduce(*this, t, op)) return Work::completed("all_reduce", name());
  detail::check_avg(*this, "all_reduce", tensor, op);
  const Target tg = impl_->target(tensor);
  const bool divide = op == ReduceOp::AVG && !tg.native.avg;  // composed AVG: SUM, then divide
  std::vector<at::Tensor> ts{for_backend(tensor, tg)};
  c10d::AllreduceOptions o;
  o.reduceOp = op == ReduceOp::AVG && tg.native.avg ? c10d::ReduceOp(c10d::ReduceOp::AVG) : to_c10d(op);
  auto work = tg.pg->allreduce(ts, o);
  const double n = size();
  return issue(*this, *impl_, "all_reduce", work,
               copy_back(tensor, ts[0], divide ? std::function<void(at::Tensor&)>([n](at::Tensor& x) { x.div_(n); })
                                               : nullptr));
}

WorkPtr C10dGroup::all_gather_into_async(const at::Tensor& output, const at::Tensor& input) {
  const detail::ObservedCollective observed(*this, "all_gather_into", detail::nbytes(input), detail::nbytes(output));
  at::Tensor out_arg = output;
  if (guard::all_gather_into(*this, out_arg, input)) return Work::completed("all_gather_into", name());
  detail::check_all_gather_shapes(*this, output, input);
  const Target tg = impl_->target(input);
  at::Tensor in = for_backend(input, tg);
  at::Tensor out = for_backend(output, tg);
  c10::intrusive_ptr<c10d::Work> work;
  if (tg.native.all_gather_base) {
    work = tg.pg->_allgather_base(out, in);
  } else {
    // Gloo's allgather into the blocks of the output: blocks of a contiguous tensor along dim 0
    // are contiguous views, so the backend writes straight into them (same bytes as one buffer).
    std::vector<std::vector<at::Tensor>> outs{out.chunk(size(), 0)};
    std::vector<at::Tensor> ins{in};
    work = tg.pg->allgather(outs, ins);
  }
  return issue(*this, *impl_, "all_gather_into", work, copy_back(output, out));
}

// NOTE: [Composed reduce_scatter]
// NCCL reduce-scatters natively. Gloo's own reduce_scatter (libtorch 2.x) is an all-reduce of
// the whole input followed by keeping one block, and 1.13's Gloo has none: an all-reduce moves
// about 2(n-1)/n of the input's bytes per rank (ring), twice what a reduce-scatter needs. So
// for every backend without a native one, reduce_scatter is composed here, in one place, as an
// all_to_all (block r of every rank goes to rank r: (n-1)/n of the input's bytes sent and
// received per rank, what a ring reduce-scatter moves) followed by a local reduction of the n
// received blocks in rank order (deterministic; needs one input-sized receive buffer). AVG is
// the SUM divided by n. DTENSOR_GLOO_REDUCE_SCATTER=all_reduce selects the all-reduce instead
// (to measure the difference: fsdp_benchmark's bytes per step).
static bool reduce_scatter_through_all_reduce() {
  static const bool on = [] {
    const char* v = std::getenv("DTENSOR_GLOO_REDUCE_SCATTER");
    if (!v || std::string(v).empty() || std::string(v) == "all_to_all") return false;
    TORCH_CHECK(std::string(v) == "all_reduce", "DTENSOR_GLOO_REDUCE_SCATTER='", v,
                "': expected all_to_all (the default) or all_reduce");
    return true;
  }();
  return on;
}

WorkPtr C10dGroup::reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const detail::ObservedCollective observed(*this, "reduce_scatter_into", detail::nbytes(input), detail::nbytes(output));
  at::Tensor out_arg = output;
  if (guard::reduce_scatter_into(*this, out_arg, input, op)) return Work::completed("reduce_scatter_into", name());
  detail::check_reduce_scatter_shapes(*this, output, input);
  detail::check_avg(*this, "reduce_scatter_into", input, op);
  const Target tg = impl_->target(input);
  at::Tensor in = for_backend(input, tg);
  const double n = size();
  if (tg.native.reduce_scatter_base) {
    at::Tensor out = for_backend(output, tg);
    c10d::ReduceScatterOptions o;
    o.reduceOp = op == ReduceOp::AVG && tg.native.avg ? c10d::ReduceOp(c10d::ReduceOp::AVG) : to_c10d(op);
    const bool divide = op == ReduceOp::AVG && !tg.native.avg;
    return issue(*this, *impl_, "reduce_scatter_into", tg.pg->_reduce_scatter_base(out, in, o),
                 copy_back(output, out, divide ? std::function<void(at::Tensor&)>([n](at::Tensor& x) { x.div_(n); })
                                               : nullptr));
  }
  if (reduce_scatter_through_all_reduce()) {
    at::Tensor all = input.clone(at::MemoryFormat::Contiguous);
    return Work::chain(all_reduce_async(all, op), [dst = output, all, n, me = rank()]() mutable {
      dst.copy_(all.chunk(static_cast<int64_t>(n), 0)[me]);
    });
  }
  at::Tensor received = at::empty_like(in, at::MemoryFormat::Contiguous);
  std::vector<int64_t> equal;  // equal blocks
  auto work = tg.pg->alltoall_base(received, in, equal, equal);
  at::Tensor dst = output;
  auto reduce = [dst, received, op, n]() mutable {
    const auto blocks = received.chunk(static_cast<int64_t>(n), 0);
    at::Tensor acc = blocks[0].clone();
    for (size_t i = 1; i < blocks.size(); ++i) {
      switch (op) {
        case ReduceOp::SUM:
        case ReduceOp::AVG: acc.add_(blocks[i]); break;
        case ReduceOp::PRODUCT: acc.mul_(blocks[i]); break;
        case ReduceOp::MIN: acc = at::minimum(acc, blocks[i]); break;
        case ReduceOp::MAX: acc = at::maximum(acc, blocks[i]); break;
      }
    }
    if (op == ReduceOp::AVG) acc.div_(n);
    dst.copy_(acc);
  };
  return issue(*this, *impl_, "reduce_scatter_into", work, reduce);
}

WorkPtr C10dGroup::all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) {
  const detail::ObservedCollective observed(*this, "all_to_all_single", detail::nbytes(input), detail::nbytes(output));
  at::Tensor out_arg = output;
  if (guard::all_to_all_single(*this, out_arg, input, output_splits, input_splits)) return Work::completed("all_to_all_single", name());
  auto splits = detail::resolve_all_to_all_splits(*this, output, input, output_splits, input_splits);
  const Target tg = impl_->target(input);
  at::Tensor in = for_backend(input, tg);
  at::Tensor out = for_backend(output, tg);
  return issue(*this, *impl_, "all_to_all_single", tg.pg->alltoall_base(out, in, splits.first, splits.second),
               copy_back(output, out));
}

WorkPtr C10dGroup::broadcast_async(const at::Tensor& tensor, int src) {
  const detail::ObservedCollective observed(*this, "broadcast", detail::nbytes(tensor), detail::nbytes(tensor));
  at::Tensor t = tensor;
  if (guard::broadcast(*this, t, src)) return Work::completed("broadcast", name());
  detail::check_rank_arg(*this, "broadcast", "src", src);
  const Target tg = impl_->target(tensor);
  std::vector<at::Tensor> ts{for_backend(tensor, tg)};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  return issue(*this, *impl_, "broadcast", tg.pg->broadcast(ts, o), copy_back(tensor, ts[0]));
}

WorkPtr C10dGroup::barrier_async() {
  const detail::ObservedCollective observed(*this, "barrier", 0, 0);
  if (guard::barrier(*this)) return Work::completed("barrier", name());
  return issue(*this, *impl_, "barrier", impl_->default_pg().barrier(), nullptr);
}

WorkPtr C10dGroup::send_async(const at::Tensor& tensor, int dst, int tag) {
  const detail::ObservedCollective observed(*this, "send", detail::nbytes(tensor), 0);
  if (guard::send(*this, tensor, dst, tag)) return Work::completed("send", name());
  detail::check_rank_arg(*this, "send", "dst", dst);
  TORCH_CHECK(dst != rank(), "send on ", describe(), ": a rank cannot send to itself");
  const Target tg = impl_->target(tensor);
  std::vector<at::Tensor> ts{for_backend(tensor, tg)};
  return issue(*this, *impl_, "send", tg.pg->send(ts, dst, tag), nullptr, /*point_to_point=*/true);
}

WorkPtr C10dGroup::recv_async(const at::Tensor& tensor, int src, int tag) {
  const detail::ObservedCollective observed(*this, "recv", 0, detail::nbytes(tensor));
  at::Tensor t = tensor;
  if (guard::recv(*this, t, src, tag)) return Work::completed("recv", name());
  detail::check_rank_arg(*this, "recv", "src", src);
  TORCH_CHECK(src != rank(), "recv on ", describe(), ": a rank cannot receive from itself");
  const Target tg = impl_->target(tensor);
  std::vector<at::Tensor> ts{for_backend(tensor, tg)};
  return issue(*this, *impl_, "recv", tg.pg->recv(ts, src, tag), copy_back(tensor, ts[0]), /*point_to_point=*/true);
}

WorkPtr C10dGroup::gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) {
  const detail::ObservedCollective observed(*this, "gather", detail::nbytes(input), detail::nbytes(outputs));
  detail::check_rank_arg(*this, "gather", "dst", dst);
  if (rank() == dst) detail::check_gather_outputs(*this, input, outputs);
  std::vector<at::Tensor> outs_arg = outputs;
  if (guard::gather(*this, input, outs_arg, dst)) {
    if (rank() == dst)
      for (size_t i = 0; i < outputs.size(); ++i) outputs[i].copy_(outs_arg[i]);
    return Work::completed("gather", name());
  }
  const Target tg = impl_->target(input);
  std::vector<at::Tensor> ins{for_backend(input, tg)};
  std::vector<std::vector<at::Tensor>> outs;
  if (rank() == dst) {
    outs.emplace_back();
    for (const auto& t : outputs) outs[0].push_back(for_backend(t, tg));
  }
  c10d::GatherOptions o;
  o.rootRank = dst;
  auto work = tg.pg->gather(outs, ins, o);
  std::function<void()> finish;
  if (rank() == dst) {
    finish = [dsts = outputs, srcs = outs[0]]() mutable {
      for (size_t i = 0; i < dsts.size(); ++i)
        if (!srcs[i].is_same(dsts[i])) dsts[i].copy_(srcs[i]);
    };
  }
  return issue(*this, *impl_, "gather", work, std::move(finish));
}

WorkPtr C10dGroup::scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  const detail::ObservedCollective observed(*this, "scatter", detail::nbytes(inputs), detail::nbytes(output));
  at::Tensor out_arg = output;
  if (guard::scatter(*this, out_arg, inputs, src)) return Work::completed("scatter", name());
  detail::check_rank_arg(*this, "scatter", "src", src);
  const Target tg = impl_->target(output);
  std::vector<std::vector<at::Tensor>> ins;
  if (rank() == src) {
    detail::check_scatter_inputs(*this, output, inputs);
    ins.emplace_back();
    for (auto& t : inputs) ins[0].push_back(for_backend(t, tg));
  }
  c10d::ScatterOptions o;
  o.rootRank = src;
  std::vector<at::Tensor> outs{for_backend(output, tg)};
  return issue(*this, *impl_, "scatter", tg.pg->scatter(outs, ins, o), copy_back(output, outs[0]));
}

std::shared_ptr<Group> C10dGroup::new_subgroup(const std::vector<int>& ranks) {
  guard::new_subgroup(*this, ranks);
  detail::check_subgroup_ranks(*this, ranks);
  // Every rank counts the calls, so the n-th call gets the same store prefix everywhere;
  // only members take part in the new group's rendezvous.
  const uint64_t id = impl_->subgroups_created++;
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  if (it == ranks.end()) return nullptr;
  std::ostringstream prefix;
  prefix << "dtensor_subgroup_" << id << "_";
  for (int r : ranks) prefix << r << ".";
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<c10d::PrefixStore>(prefix.str(), impl_->store);
  auto sub = create(store, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                    impl_->options);
  // Before its first collective, which fixes its name (Group::name()).
  sub->impl_->global_ranks.clear();
  for (int r : ranks) sub->impl_->global_ranks.push_back(impl_->global_ranks[r]);
  return sub;
}

}  // namespace comm
}  // namespace dtensor
