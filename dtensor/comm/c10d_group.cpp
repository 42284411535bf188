// dtensor/comm/c10d_group.cpp
#include "dtensor/comm/c10d_group.h"

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

#include <cstdlib>
#include <map>
#include <sstream>

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

// "gloo" -> {{"", "gloo"}}; "cpu:gloo,cuda:nccl" -> {{"cpu","gloo"},{"cuda","nccl"}}.
std::vector<std::pair<std::string, std::string>> parse_backend(const std::string& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      out.emplace_back("", item);
    } else {
      out.emplace_back(item.substr(0, colon), item.substr(colon + 1));
    }
  }
  TORCH_CHECK(!out.empty(), "empty backend name; expected gloo, nccl, mpi or e.g. cpu:gloo,cuda:nccl");
  if (out.size() > 1) {
    for (auto& kv : out)
      TORCH_CHECK(!kv.first.empty(), "backend list '", spec,
                  "' mixes plain and device:backend entries; write e.g. cpu:gloo,cuda:nccl");
  }
  return out;
}

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
  std::vector<std::pair<std::string, std::string>> parts;
  try {
    parts = parse_backend(backend);
  } catch (const c10::Error& e) {
    if (why) *why = e.what_without_backtrace();
    return false;
  }
  for (auto& kv : parts)
    if (!one_backend_available(kv.second, why)) return false;
  return true;
}

struct C10dGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0, size = 1;
  C10dGroupOptions options;
  std::vector<int> global_ranks;
  // device type ("" for a single backend) -> process group
  std::vector<std::pair<std::string, c10::intrusive_ptr<BackendPg>>> pgs;
  uint64_t subgroups_created = 0;

  BackendPg& pg_for(const at::Tensor& t) {
    if (pgs.size() == 1) return *pgs[0].second;
    const std::string dev = c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
    for (auto& kv : pgs)
      if (kv.first == dev) return *kv.second;
    TORCH_CHECK(false, "backend ", options.backend, " has no process group for device ", dev);
  }
  BackendPg& default_pg() { return *pgs[0].second; }
};

static c10::intrusive_ptr<BackendPg> make_pg(const std::string& name,
                                                      const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      const C10dGroupOptions& o) {
  std::string why;
  TORCH_CHECK(one_backend_available(name, &why), why);
  if (name == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
    std::string host = o.gloo_hostname;
    if (host.empty()) {
      if (const char* h = std::getenv("DTENSOR_GLOO_HOSTNAME")) host = h;
    }
    if (host.empty()) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    }
    opts->threads = 1;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  }
#ifdef DTENSOR_WITH_NCCL
  if (name == "nccl") {
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

C10dGroup::C10dGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
C10dGroup::~C10dGroup() = default;

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
  auto parts = parse_backend(options.backend);
  for (auto& kv : parts) {
    c10::intrusive_ptr<c10d::Store> sub = store;
    if (parts.size() > 1) sub = c10::make_intrusive<c10d::PrefixStore>("backend_" + kv.second, store);
    impl->pgs.emplace_back(kv.first, make_pg(kv.second, sub, rank, size, options));
  }
  return std::shared_ptr<C10dGroup>(new C10dGroup(std::move(impl)));
}

int C10dGroup::rank() const { return impl_->rank; }
int C10dGroup::size() const { return impl_->size; }
std::string C10dGroup::backend() const { return impl_->options.backend; }
const std::vector<int>& C10dGroup::global_ranks() const { return impl_->global_ranks; }

namespace {

// Waits for `work`, turning c10d/Gloo failures into CollectiveError with context.
void wait_work(const Group& g, const char* op, const c10::intrusive_ptr<c10d::Work>& work,
               std::chrono::milliseconds timeout) {
  try {
    work->wait(timeout);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto* ce = dynamic_cast<const c10::Error*>(&e)) what = ce->what_without_backtrace();
    throw CollectiveError(std::string(op) + " on " + g.describe() + " failed: " + what);
  }
}

// Gloo needs dense contiguous buffers: run `fn` on a contiguous buffer and copy back.
template <class Fn>
void with_contiguous(at::Tensor& t, Fn fn) {
  if (t.is_contiguous()) {
    fn(t);
  } else {
    at::Tensor c = t.contiguous();
    fn(c);
    t.copy_(c);
  }
}

}  // namespace

void C10dGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  TORCH_CHECK(op != ReduceOp::AVG || at::isFloatingType(tensor.scalar_type()) ||
                  at::isComplexType(tensor.scalar_type()),
              "all_reduce on ", describe(), ": ReduceOp::AVG needs a floating dtype, got ",
              tensor.scalar_type());
  with_contiguous(tensor, [&](at::Tensor& t) {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    wait_work(*this, "all_reduce", impl_->pg_for(t).allreduce(ts, o), impl_->options.timeout);
    if (op == ReduceOp::AVG) t.div_(static_cast<double>(size()));
  });
}

void C10dGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  detail::check_all_gather_shapes(*this, output, input);
  // Emulated: 1.13 Gloo has no _allgather_base. Blocks of a contiguous output along dim 0
  // are contiguous views, so Gloo writes straight into them.
  std::vector<std::vector<at::Tensor>> outs{output.chunk(size(), 0)};
  std::vector<at::Tensor> ins{input.contiguous()};
  wait_work(*this, "all_gather_into", impl_->pg_for(input).allgather(outs, ins),
            impl_->options.timeout);
}

void C10dGroup::reduce_scatter_into(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  detail::check_reduce_scatter_shapes(*this, output, input);
  // Emulated: 1.13 Gloo has no reduce_scatter. All-reduce a copy, keep this rank's block.
  at::Tensor tmp = input.clone(at::MemoryFormat::Contiguous);
  all_reduce(tmp, op);
  output.copy_(tmp.chunk(size(), 0)[rank()]);
}

void C10dGroup::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                  const std::vector<int64_t>& output_splits,
                                  const std::vector<int64_t>& input_splits) {
  auto splits = detail::resolve_all_to_all_splits(*this, output, input, output_splits, input_splits);
  at::Tensor in = input.contiguous();
  with_contiguous(output, [&](at::Tensor& out) {
    wait_work(*this, "all_to_all_single",
              impl_->pg_for(in).alltoall_base(out, in, splits.first, splits.second),
              impl_->options.timeout);
  });
}

void C10dGroup::broadcast(at::Tensor& tensor, int src) {
  detail::check_rank_arg(*this, "broadcast", "src", src);
  with_contiguous(tensor, [&](at::Tensor& t) {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = src;
    wait_work(*this, "broadcast", impl_->pg_for(t).broadcast(ts, o), impl_->options.timeout);
  });
}

void C10dGroup::barrier() {
  wait_work(*this, "barrier", impl_->default_pg().barrier(), impl_->options.timeout);
}

void C10dGroup::send(const at::Tensor& tensor, int dst, int tag) {
  detail::check_rank_arg(*this, "send", "dst", dst);
  TORCH_CHECK(dst != rank(), "send on ", describe(), ": a rank cannot send to itself");
  std::vector<at::Tensor> ts{tensor.contiguous()};
  wait_work(*this, "send", impl_->pg_for(tensor).send(ts, dst, tag), impl_->options.timeout);
}

void C10dGroup::recv(at::Tensor& tensor, int src, int tag) {
  detail::check_rank_arg(*this, "recv", "src", src);
  TORCH_CHECK(src != rank(), "recv on ", describe(), ": a rank cannot receive from itself");
  with_contiguous(tensor, [&](at::Tensor& t) {
    std::vector<at::Tensor> ts{t};
    wait_work(*this, "recv", impl_->pg_for(t).recv(ts, src, tag), impl_->options.timeout);
  });
}

void C10dGroup::gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int dst) {
  detail::check_rank_arg(*this, "gather", "dst", dst);
  std::vector<at::Tensor> ins{input.contiguous()};
  std::vector<std::vector<at::Tensor>> outs;
  if (rank() == dst) {
    outs.emplace_back();
    for (int r = 0; r < size(); ++r) outs[0].push_back(at::empty_like(ins[0]));
  }
  c10d::GatherOptions o;
  o.rootRank = dst;
  wait_work(*this, "gather", impl_->pg_for(input).gather(outs, ins, o), impl_->options.timeout);
  if (rank() == dst) outputs = std::move(outs[0]);
}

void C10dGroup::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  detail::check_rank_arg(*this, "scatter", "src", src);
  std::vector<std::vector<at::Tensor>> ins;
  if (rank() == src) {
    TORCH_CHECK(static_cast<int>(inputs.size()) == size(), "scatter on ", describe(),
                ": src rank passed ", inputs.size(), " tensors, expected ", size());
    ins.emplace_back();
    for (auto& t : inputs) {
      TORCH_CHECK(t.sizes() == output.sizes() && t.scalar_type() == output.scalar_type(),
                  "scatter on ", describe(), ": an input is ", t.scalar_type(), t.sizes(),
                  " but the output is ", output.scalar_type(), output.sizes());
      ins[0].push_back(t.contiguous());
    }
  }
  c10d::ScatterOptions o;
  o.rootRank = src;
  with_contiguous(output, [&](at::Tensor& out) {
    std::vector<at::Tensor> outs{out};
    wait_work(*this, "scatter", impl_->pg_for(out).scatter(outs, ins, o), impl_->options.timeout);
  });
}

std::shared_ptr<Group> C10dGroup::new_subgroup(const std::vector<int>& ranks) {
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
  sub->impl_->global_ranks.clear();
  for (int r : ranks) sub->impl_->global_ranks.push_back(impl_->global_ranks[r]);
  return sub;
}

}  // namespace comm
}  // namespace dtensor
