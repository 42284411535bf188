// tools/comm_plan: every collective one rank of a large job would issue in one training step of
// the reference Transformer, found in one process on a fake world (NOTE: [Fake world] in
// dtensor/comm/fake_group.h) and recorded by CommDebugMode: per kind, the count, the bytes
// the rank sends and receives and the group sizes; then CommDebugMode's per-module table; then
// the rank's memory, from MemTracker (NOTE: [MemTracker] in dtensor/debug/mem_tracker.h): what
// its parameters, gradients and Adam's state hold, the step's peak per phase and by use at its
// moment, and each module's forward; with --checkpoint, the checkpoint of the model and the
// optimizer, planned as save and load would run it (what this rank writes and reads, the
// busiest rank, the metadata file): that costs O(ranks x keys), as the coordinator's merge does
// on the real job, seconds at 512 ranks where the step's plan takes a tenth of one.
//
//   comm_plan --mesh 64x8 --parallel fsdp+tp [--rank 300] [--dim 256] [--layers 2] [--heads 8]
//             [--vocab 1024] [--seq 64] [--batch 1] [--sequence-parallel] [--noise-level 0..3]
//             [--json FILE] [--checkpoint]
//
// --parallel: fsdp (a 1-D mesh: fully_shard on each block and the root), tp (a 1-D mesh:
// Transformer::parallelize), fsdp+tp (a 2-D (dp, tp) mesh: parallelize on tp, then
// fully_shard on dp). The step: forward on --batch sequences of --seq tokens, cross-entropy,
// backward, an Adam step; the step measured is the second (Adam's state exists, as in a
// training loop), after zero_grad. Nothing holds data: the model is built on the meta device
// (nn::DeviceContext) and the mesh is a "meta" mesh over the fake world, so every tensor of the
// step is a meta tensor, whose bytes MemTracker counts as a real rank's; a model of billions of
// parameters is planned in seconds, on any machine.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/fake_group.h"
#include "dtensor/debug/comm_mode.h"
#include "dtensor/debug/mem_tracker.h"
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/device_context.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "models/models.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

int usage(const std::string& why) {
  std::cerr << "comm_plan: " << why << "\n"
            << "usage: comm_plan --mesh N|DPxTP --parallel fsdp|tp|fsdp+tp [--rank R] [--dim D] [--layers L]\n"
               "                 [--heads H] [--vocab V] [--seq S] [--batch B] [--sequence-parallel]\n"
               "                 [--noise-level 0..3] [--json FILE] [--checkpoint]\n";
  return 2;
}

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw std::invalid_argument(flag + " " + v + ": not an integer");
  if (n < min) throw std::invalid_argument(flag + " " + v + ": must be at least " + std::to_string(min));
  return n;
}

std::vector<int64_t> parse_mesh(const std::string& v) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (true) {
    const size_t x = v.find('x', start);
    shape.push_back(parse_int("--mesh", v.substr(start, x == std::string::npos ? std::string::npos : x - start), 1));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  if (shape.size() > 2) throw std::invalid_argument("--mesh " + v + ": one or two dims (N or DPxTP)");
  return shape;
}

struct Options {
  std::vector<int64_t> mesh;
  std::string parallel;
  int64_t rank = 0, batch = 1;
  int noise_level = 0;
  bool sequence_parallel = false;
  bool checkpoint = false;
  std::string json;
  dtensor::models::ModelArgs args;
};

Options parse(int argc, char** argv) {
  Options o;
  o.args.dropout_p = 0.0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sequence-parallel" || a == "--checkpoint") {
      (a == "--checkpoint" ? o.checkpoint : o.sequence_parallel) = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + ": missing its value");
    const std::string v = argv[++i];
    if (a == "--mesh") o.mesh = parse_mesh(v);
    else if (a == "--parallel") o.parallel = v;
    else if (a == "--rank") o.rank = parse_int(a, v, 0);
    else if (a == "--dim") o.args.dim = parse_int(a, v, 1);
    else if (a == "--layers") o.args.n_layers = parse_int(a, v, 1);
    else if (a == "--heads") o.args.n_heads = parse_int(a, v, 1);
    else if (a == "--vocab") o.args.vocab_size = parse_int(a, v, 1);
    else if (a == "--seq") o.args.max_seq_len = parse_int(a, v, 1);
    else if (a == "--batch") o.batch = parse_int(a, v, 1);
    else if (a == "--noise-level") o.noise_level = static_cast<int>(parse_int(a, v, 0));
    else if (a == "--json") o.json = v;
    else throw std::invalid_argument("unknown option " + a);
  }
  if (o.mesh.empty()) throw std::invalid_argument("--mesh is required");
  if (o.parallel != "fsdp" && o.parallel != "tp" && o.parallel != "fsdp+tp")
    throw std::invalid_argument("--parallel '" + o.parallel + "': expected fsdp, tp or fsdp+tp");
  if ((o.parallel == "fsdp+tp") != (o.mesh.size() == 2))
    throw std::invalid_argument("--parallel " + o.parallel + " needs a " + (o.parallel == "fsdp+tp" ? "2-D (DPxTP)" : "1-D") +
                                " --mesh");
  if (o.args.dim % o.args.n_heads != 0)
    throw std::invalid_argument("--dim " + std::to_string(o.args.dim) + " is not a multiple of --heads " +
                                std::to_string(o.args.n_heads));
  int64_t world = 1;
  for (int64_t d : o.mesh) world *= d;
  if (o.rank >= world)
    throw std::invalid_argument("--rank " + std::to_string(o.rank) + " is not in a world of " + std::to_string(world));
  return o;
}

int run(const Options& o) {
  using namespace dtensor;
  int64_t world_size = 1;
  for (int64_t d : o.mesh) world_size *= d;
  const auto start = std::chrono::steady_clock::now();
  auto world = std::make_shared<comm::FakeGroup>(static_cast<int>(o.rank), static_cast<int>(world_size));
  const DeviceMesh mesh = o.mesh.size() == 2 ? init_device_mesh("meta", o.mesh, {"dp", "tp"}, world)
                                             : init_device_mesh("meta", o.mesh, {}, world);
  debug::MemTracker mem;  // before the model: NOTE: [MemTracker]
  models::Transformer model{nullptr};
  {
    nn::DeviceContext on_meta(c10::kMeta);
    model = models::Transformer(o.args);
  }
  int64_t n_params = 0;  // tied weights once
  std::set<const void*> counted;
  for (const auto& p : model->parameters())
    if (counted.insert(p.unsafeGetTensorImpl()).second) n_params += p.numel();
  if (o.parallel == "tp" || o.parallel == "fsdp+tp")
    models::Transformer::parallelize(model, o.parallel == "tp" ? mesh : mesh["tp"], o.sequence_parallel);
  if (o.parallel == "fsdp" || o.parallel == "fsdp+tp") {
    fsdp::FullyShardOptions fo;
    fo.mesh = o.parallel == "fsdp" ? mesh : mesh["dp"];
    for (size_t i = 0; i < model->layers->size(); ++i) fsdp::fully_shard(*model->layers->ptr(i), fo);
    fsdp::fully_shard(model, fo);
  }
  torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(1e-3));
  const int64_t seq = o.args.max_seq_len;
  const at::Tensor tokens = at::empty({o.batch, seq}, at::TensorOptions().dtype(at::kLong).device(c10::kMeta));
  const at::Tensor targets = at::empty({o.batch * seq}, at::TensorOptions().dtype(at::kLong).device(c10::kMeta));
  auto forward_loss = [&] {
    at::Tensor logits = nn::call(model, tokens);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, o.args.vocab_size}), targets);
  };
  opt.zero_grad();
  forward_loss().backward();
  opt.step();
  opt.zero_grad();
  debug::CommDebugMode mode;
  mem.track_external(*model);
  mem.track_external(opt);
  const debug::HeldMemory before = mem.held();
  int64_t phase_peak[3] = {0, 0, 0};
  debug::MemoryByUse phase_by_use[3];
  {
    auto comm_active = mode.enter();
    auto mem_active = mem.enter();
    at::Tensor loss = forward_loss();
    phase_peak[0] = mem.peak();
    phase_by_use[0] = mem.peak_by_use();
    mem.reset_peak();
    loss.backward();
    loss = at::Tensor();
    phase_peak[1] = mem.peak();
    phase_by_use[1] = mem.peak_by_use();
    mem.reset_peak();
    opt.step();
    phase_peak[2] = mem.peak();
    phase_by_use[2] = mem.peak_by_use();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string shape;
  for (size_t d = 0; d < o.mesh.size(); ++d)
    shape += (d ? ", " : "") + (o.mesh.size() == 2 ? std::string(d ? "tp=" : "dp=") : std::string()) + std::to_string(o.mesh[d]);
  std::printf("rank %lld of %lld on a mesh (%s), %s%s; Transformer of %.3g parameters: dim %lld, %lld layers, %lld heads, "
              "vocab %lld, %lld x %lld tokens; one step (forward, cross-entropy, backward, Adam)\n",
              (long long)o.rank, (long long)world_size, shape.c_str(), o.parallel.c_str(),
              o.sequence_parallel ? " (sequence parallel)" : "", static_cast<double>(n_params), (long long)o.args.dim,
              (long long)o.args.n_layers,
              (long long)o.args.n_heads, (long long)o.args.vocab_size, (long long)o.batch, (long long)seq);
  struct Row {
    int64_t count = 0, sent = 0, received = 0;
    std::map<int, int64_t> group_sizes;
  };
  std::map<std::string, Row> rows;
  Row total;
  for (const auto& c : mode.get_collectives()) {
    Row& r = rows[std::string(c.backward ? "backward " : "forward  ") + c.op];
    for (Row* x : {&r, &total}) {
      ++x->count;
      x->sent += c.input_bytes;
      x->received += c.output_bytes;
      ++x->group_sizes[c.group_size];
    }
  }
  std::printf("\n%-52s %6s %12s %12s  %s\n", "pass and collective", "count", "sent", "received", "group sizes (count)");
  auto print_row = [](const std::string& name, const Row& r) {
    std::string sizes;
    for (const auto& [size, n] : r.group_sizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(size) + " (" + std::to_string(n) + ")";
    std::printf("%-52s %6lld %12s %12s  %s\n", name.c_str(), (long long)r.count,
                debug::format_bytes(r.sent).c_str(), debug::format_bytes(r.received).c_str(), sizes.c_str());
  };
  for (const auto& [name, r] : rows) print_row(name, r);
  print_row("total", total);
  std::printf("\n%s", mode.generate_comm_debug_tracing_table(o.noise_level).c_str());
  if (!o.json.empty()) {
    mode.generate_json_dump(o.json, o.noise_level);
    std::printf("JSON: %s\n", o.json.c_str());
  }
  const debug::HeldMemory after = mem.held();
  const int peak_phase = static_cast<int>(std::max_element(phase_peak, phase_peak + 3) - phase_peak);
  const int64_t step_peak = phase_peak[peak_phase];
  const debug::MemoryByUse& at_peak = phase_by_use[peak_phase];
  using debug::format_bytes;
  std::printf("\nmemory of this rank (bytes of the tensors it allocates; one step, after zero_grad)\n");
  std::printf("%-34s %12s %12s\n", "", "before", "after");
  auto held_row = [](const char* name, int64_t b, int64_t a) {
    std::printf("%-34s %12s %12s\n", name, format_bytes(b).c_str(), format_bytes(a).c_str());
  };
  held_row("parameters", before.parameters, after.parameters);
  held_row("buffers", before.buffers, after.buffers);
  held_row("gradients", before.gradients, after.gradients);
  held_row("optimizer state", before.optimizer_state, after.optimizer_state);
  held_row("total", before.total(), after.total());
  std::printf("the step's own allocations at their peak: %s (forward %s, backward %s, optimizer step %s); "
              "left allocated after it: %s\n",
              format_bytes(step_peak).c_str(), format_bytes(phase_peak[0]).c_str(), format_bytes(phase_peak[1]).c_str(),
              format_bytes(phase_peak[2]).c_str(), format_bytes(mem.current()).c_str());
  const char* phase_names[3] = {"forward", "backward", "optimizer step"};
  std::printf("at that peak (in %s), by use: activations %s, backward (gradients, temporaries) %s, unsharded "
              "parameters %s, all-gather buffers %s, reduce-scatter buffers %s, other %s\n",
              phase_names[peak_phase], format_bytes(at_peak.activations).c_str(), format_bytes(at_peak.backward).c_str(),
              format_bytes(at_peak.unsharded_parameters).c_str(), format_bytes(at_peak.all_gather_buffers).c_str(),
              format_bytes(at_peak.reduce_scatter_buffers).c_str(), format_bytes(at_peak.other).c_str());
  std::printf("peak during the step, at most: %s (held before + the step's peak)\n\n%s",
              format_bytes(before.total() + step_peak).c_str(), mem.display_modulewise_stats().c_str());
  std::printf("planned in %.2f s\n", seconds);
  if (!o.checkpoint) return 0;

  // The checkpoint of the model and the optimizer (PyTorch's get_state_dict: sharded state
  // dicts), planned as save and load would run it (NOTE: [Checkpoint plans]).
  const auto ckpt_start = std::chrono::steady_clock::now();
  checkpoint::StateDict sd = checkpoint::with_prefix(checkpoint::get_model_state_dict(*model), "model.");
  for (auto& [k, v] : checkpoint::with_prefix(checkpoint::get_optimizer_state_dict(*model, opt), "optim."))
    sd.emplace(k, v);
  checkpoint::SaveOptions so;
  so.process_group = world;
  const checkpoint::PlannedSave save = checkpoint::plan_save(sd, so);
  const checkpoint::PlannedLoad load = checkpoint::plan_load(sd, save.metadata);
  const double ckpt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ckpt_start).count();
  int64_t total_bytes = 0;
  for (int64_t b : save.bytes_per_rank) total_bytes += b;
  const int64_t busiest = *std::max_element(save.bytes_per_rank.begin(), save.bytes_per_rank.end());
  const int64_t writers = std::count_if(save.bytes_per_rank.begin(), save.bytes_per_rank.end(), [](int64_t b) { return b > 0; });
  const int64_t mine = save.bytes_per_rank.at(static_cast<size_t>(o.rank));
  std::printf("\ncheckpoint of the model and Adam's state (%zu keys, %s): save: this rank writes %s in %zu chunks; "
              "the busiest rank %s; %lld of %lld ranks write; the metadata file %s\n"
              "load into the same layout: this rank reads %s of tensors from %zu stored chunks, and %zu objects\n"
              "checkpoint planned in %.2f s\n",
              save.metadata.entries.size(), format_bytes(total_bytes).c_str(), format_bytes(mine).c_str(),
              save.plan.items.size(), format_bytes(busiest).c_str(), (long long)writers, (long long)world_size,
              format_bytes(static_cast<int64_t>(nlohmann::json(save.metadata).dump().size())).c_str(),
              format_bytes(load.bytes).c_str(), load.reads.size(), load.objects.size(), ckpt_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    return usage(e.what());
  }
  try {
    return run(o);
  } catch (const c10::Error& e) {
    std::cerr << "comm_plan: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "comm_plan: " << e.what() << "\n";
  }
  return 1;
}
