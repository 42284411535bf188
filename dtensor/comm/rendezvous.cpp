// dtensor/comm/rendezvous.cpp
#include "dtensor/comm/rendezvous.h"

#include "dtensor/comm/device.h"
#include "dtensor/compat.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <iostream>

extern char** environ;

namespace dtensor {
namespace comm {

namespace {

using Env = std::map<std::string, std::string>;

Env process_env() {
  Env e;
  for (char** p = environ; p && *p; ++p) {
    std::string kv(*p);
    auto eq = kv.find('=');
    if (eq != std::string::npos) e[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return e;
}

const std::string* find(const Env& e, const std::string& k) {
  auto it = e.find(k);
  return it == e.end() ? nullptr : &it->second;
}

int parse_int(const Env& e, const std::string& k, const std::string& source) {
  const std::string* v = find(e, k);
  TORCH_CHECK(v != nullptr, "rendezvous from ", source, ": ", k, " is not set");
  try {
    size_t pos = 0;
    int x = std::stoi(*v, &pos);
    TORCH_CHECK(pos == v->size(), "trailing characters");
    return x;
  } catch (const std::exception&) {
    TORCH_CHECK(false, "rendezvous from ", source, ": ", k, "='", *v, "' is not an integer");
  }
}

void validate(const RendezvousInfo& r) {
  TORCH_CHECK(r.world_size >= 1, "rendezvous from ", r.source, ": world size ", r.world_size,
              " must be >= 1");
  TORCH_CHECK(r.rank >= 0 && r.rank < r.world_size, "rendezvous from ", r.source, ": rank ",
              r.rank, " is outside [0, ", r.world_size, ")");
  TORCH_CHECK(r.master_port > 0 && r.master_port < 65536, "rendezvous from ", r.source,
              ": MASTER_PORT ", r.master_port, " is not a valid port");
  TORCH_CHECK(!r.master_addr.empty(), "rendezvous from ", r.source, ": no master address");
}

}  // namespace

std::string first_host_of_nodelist(const std::string& nodelist) {
  // Take the first comma-separated entry that is outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  auto lb = first.find('[');
  if (lb == std::string::npos) return first;
  std::string prefix = first.substr(0, lb);
  std::string inside = first.substr(lb + 1, first.find(']') - lb - 1);
  std::string head = inside.substr(0, inside.find_first_of(",-"));
  return prefix + head;
}

std::optional<RendezvousInfo> rendezvous_from_env(const Env* env_in) {
  Env owned;
  if (!env_in) owned = process_env();
  const Env& env = env_in ? *env_in : owned;
  RendezvousInfo r;
  auto master_from_env = [&](const std::string& fallback_addr) {
    const std::string* a = find(env, "MASTER_ADDR");
    r.master_addr = a ? *a : fallback_addr;
    r.master_port = find(env, "MASTER_PORT") ? parse_int(env, "MASTER_PORT", r.source)
                                             : kDefaultMasterPort;
  };
  if (find(env, "RANK") || find(env, "WORLD_SIZE")) {
    r.source = "torchrun";
    r.rank = parse_int(env, "RANK", r.source);
    r.world_size = parse_int(env, "WORLD_SIZE", r.source);
    r.local_rank = find(env, "LOCAL_RANK") ? parse_int(env, "LOCAL_RANK", r.source) : r.rank;
    TORCH_CHECK(find(env, "MASTER_ADDR"), "rendezvous from torchrun: MASTER_ADDR is not set");
    TORCH_CHECK(find(env, "MASTER_PORT"), "rendezvous from torchrun: MASTER_PORT is not set");
    master_from_env("");
  } else if (find(env, "OMPI_COMM_WORLD_RANK")) {
    r.source = "openmpi";
    r.rank = parse_int(env, "OMPI_COMM_WORLD_RANK", r.source);
    r.world_size = parse_int(env, "OMPI_COMM_WORLD_SIZE", r.source);
    r.local_rank = find(env, "OMPI_COMM_WORLD_LOCAL_RANK")
                       ? parse_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", r.source)
                       : r.rank;
    master_from_env("127.0.0.1");
  } else if (find(env, "SLURM_PROCID")) {
    r.source = "slurm";
    r.rank = parse_int(env, "SLURM_PROCID", r.source);
    r.world_size = parse_int(env, "SLURM_NTASKS", r.source);
    r.local_rank = find(env, "SLURM_LOCALID") ? parse_int(env, "SLURM_LOCALID", r.source) : r.rank;
    std::string host;
    if (auto* nl = find(env, "SLURM_STEP_NODELIST")) host = first_host_of_nodelist(*nl);
    else if (auto* nl2 = find(env, "SLURM_NODELIST")) host = first_host_of_nodelist(*nl2);
    TORCH_CHECK(find(env, "MASTER_ADDR") || !host.empty(),
                "rendezvous from slurm: neither MASTER_ADDR nor SLURM_(STEP_)NODELIST is set");
    master_from_env(host);
  } else {
    return std::nullopt;
  }
  validate(r);
  return r;
}

c10::intrusive_ptr<c10d::Store> make_file_store(const std::string& path, int world_size) {
  TORCH_CHECK(!path.empty(), "make_file_store: empty path");
  TORCH_CHECK(world_size >= 1, "make_file_store: world size must be >= 1");
  return c10::make_intrusive<c10d::FileStore>(path, world_size);
}

c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& addr, int port, int rank,
                                               int world_size, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = rank == 0;
  o.numWorkers = world_size;
  o.waitWorkers = false;
  o.timeout = timeout;
  compat::disable_libuv(o);
  return c10::make_intrusive<c10d::TCPStore>(addr, o);
}

GroupPtr init_process_group(const InitOptions& options) {
  {
    bool already = false;
    try {
      already = is_initialized();
    } catch (...) {
    }
    TORCH_CHECK(!already, "init_process_group: a default process group already exists; call "
                          "destroy_process_group() first");
  }
  const std::string& m = options.init_method;
  c10::intrusive_ptr<c10d::Store> store;
  int rank = options.rank, world = options.world_size;
  int local_rank = -1;
  if (m == "env://" || m.empty()) {
    auto info = rendezvous_from_env();
    TORCH_CHECK(info.has_value(),
                "init_process_group(env://): no launcher variables found; set RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT (torchrun), or run under mpirun or srun");
    TORCH_CHECK(options.rank < 0 || options.rank == info->rank, "init_process_group: rank ",
                options.rank, " contradicts ", info->source, "'s rank ", info->rank);
    TORCH_CHECK(options.world_size < 0 || options.world_size == info->world_size,
                "init_process_group: world_size ", options.world_size, " contradicts ",
                info->source, "'s ", info->world_size);
    rank = info->rank;
    world = info->world_size;
    local_rank = info->local_rank;
    std::cerr << "dtensor: rendezvous from " << info->source << ": rank " << rank << " of "
              << world << " (local rank " << info->local_rank << "), master " << info->master_addr
              << ":" << info->master_port << std::endl;
    store = make_tcp_store(info->master_addr, info->master_port, rank, world, options.timeout);
  } else {
    TORCH_CHECK(rank >= 0 && world >= 1 && rank < world, "init_process_group(", m,
                "): pass rank (0 <= rank < world_size) and world_size; got rank ", rank,
                ", world_size ", world);
    if (m.rfind("file://", 0) == 0) {
      store = make_file_store(m.substr(7), world);
    } else if (m.rfind("tcp://", 0) == 0) {
      std::string hp = m.substr(6);
      auto colon = hp.rfind(':');
      TORCH_CHECK(colon != std::string::npos, "init_process_group: '", m,
                  "' has no port; expected tcp://host:port");
      int port = 0;
      try {
        port = std::stoi(hp.substr(colon + 1));
      } catch (...) {
        TORCH_CHECK(false, "init_process_group: bad port in '", m, "'");
      }
      store = make_tcp_store(hp.substr(0, colon), port, rank, world, options.timeout);
    } else {
      TORCH_CHECK(false, "init_process_group: unknown init_method '", m,
                  "'; expected env://, file://PATH or tcp://HOST:PORT");
    }
  }
  if (m != "env://" && !m.empty()) local_rank = local_rank_from_env();
  // NOTE: [Rank devices]: one GPU per rank, current before NCCL creates its communicators.
  if (detail::backend_uses_cuda(options.backend)) use_rank_cuda_device(rank, local_rank);
  C10dGroupOptions go;
  go.backend = options.backend;
  go.timeout = options.timeout;
  auto g = C10dGroup::create(store, rank, world, go);
  set_default_group(g);
  return g;
}

}  // namespace comm
}  // namespace dtensor
