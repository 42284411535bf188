// dtensor/tensor/random.h
//
// Random numbers for DTensors (DESIGN.md layer tensor/, "RNG tracker"): random ops on
// DTensors (dropout, bernoulli_, uniform_, normal_, rand_like, ...) and the random factories
// below give, for EVERY placement, exactly the values the single-device op gives on the whole
// tensor from the same generator state. The counterpart of torch.distributed.tensor._random
// (manual_seed, OffsetBasedRNGTracker) and of torch.distributed.tensor.randn/rand.
//
//   auto mesh = dtensor::init_device_mesh("cpu", {4});
//   dtensor::manual_seed(42, mesh);                         // collective: the same seed everywhere
//   at::Tensor x = dtensor::randn({8, 4}, mesh, {dtensor::Shard{0}});
//   at::Tensor y = at::dropout(x, 0.5, /*train=*/true);     // the single-device mask
//   // With at::manual_seed(42) on one device, at::randn({8, 4}) then at::dropout(...) give
//   // full_tensor(x) and full_tensor(y).
//
// NOTE: [RNG tracker]
// Random ops on DTensors draw from a generator of their own, one per world group (the group a
// DeviceMesh was built over, shared by its sub-meshes): one per process when ranks are
// processes, one per rank when ranks are threads (libtorch's default CPU generator is shared
// by the threads of a process, so it cannot serve as a per-rank stream). It is separate from
// the default generator: plain random ops neither disturb DTensor ones nor are disturbed.
//   - manual_seed(seed, mesh) seeds it (collective over the mesh's world: the seeds are
//     compared, and differing seeds raise on every rank, naming them). Seeded with s, it is in
//     the state at::manual_seed(s) gives the default generator.
//   - Without manual_seed, the first random op on a DTensor of a world (or the first factory
//     call) copies the default CPU generator's state of world rank 0 to every rank: a broadcast
//     over the world, so every rank of the world must reach it (as SPMD programs do; PyTorch
//     syncs from rank 0 at first use too). Call manual_seed first to avoid that collective.
//   - The ranks' generators stay equal as long as they run the same random ops in the same
//     order: every op draws on every rank as many numbers as the single-device op on the whole
//     tensor (NOTE: [Random ops on DTensors]).
//
// NOTE: [Random ops on DTensors]
// libtorch's CPU generator is mt19937, which cannot skip ahead, and its kernels make the value
// of an element depend on more than its index (normal_ pairs values 8 apart in blocks of 16
// for tensors of 16+ elements, so the same draws give other values in a smaller tensor). A rank
// therefore cannot generate only its shard. Instead, for an op whose rule is marked random
// (RuleOptions::random), every rank:
//   1. builds global stand-ins of the op's DTensor arguments: a tensor of the global shape and
//      strides holding its local shard in place and zeros elsewhere (a replicated argument is
//      its own stand-in);
//   2. runs the op on them, drawing from the op's Generator argument when one is given, else
//      from the tracker;
//   3. keeps its shard of every output (for an in-place op, copies it into its local tensor).
// The ops registered draw a fixed number of values per element whatever the values, so the
// kept elements are exactly the single-device ones. Ops without a Generator argument
// (rand_like, randn_like, native_dropout) are re-expressed through the ops libtorch's CPU
// kernels are made of (empty_like + uniform_/normal_/bernoulli_), given the generator.
// Cost: every rank generates (and computes the op on) the whole tensor: O(global numel) time
// and memory per op on every rank instead of O(local), and no communication. That is the price
// of bit-equality with the single-device op on a generator without skip-ahead; for dropout on
// activations of a tensor-parallel model it means each rank draws the whole mask.
// An explicit Generator argument must be in the same state on every rank, and in thread mode
// each rank must pass its own generator object (one shared by the rank threads would be
// drawn from by all of them).
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace dtensor {

// Collective over mesh.world(): every rank of that group must call it with the same seed (a
// mismatch raises on every rank, naming the ranks and their seeds). Seeds the RNG tracker of
// the world (NOTE: [RNG tracker]); later random ops on DTensors of any mesh over that world
// draw from it.
void manual_seed(uint64_t seed, const DeviceMesh& mesh);

// The tracker's generator for `mesh` (NOTE: [RNG tracker]). Collective the first time for a
// world that was not seeded with manual_seed (it copies world rank 0's default generator).
at::Generator get_rng_generator(const DeviceMesh& mesh);

// True when this rank's tracker for the mesh's world exists (seeded or synced). Local.
bool rng_tracker_initialized(const DeviceMesh& mesh);

// Collective (the tracker's first use may be). A DTensor of global shape `size` whose values
// are those at::rand / at::randn give from the tracker's generator state, laid out by
// `placements` (Shard or Replicate on each mesh dim; Partial is refused). `options` sets
// dtype (floating) and requires_grad (the result is then a leaf); its device must be the
// mesh's (CPU).
at::Tensor rand(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                const at::TensorOptions& options = {});
at::Tensor randn(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                 const at::TensorOptions& options = {});

namespace detail {

// A DTensor argument of a random op, as the dispatcher fallback passes it.
struct RandomOpInput {
  size_t arg = 0;         // schema argument index
  int64_t list_pos = -1;  // position in a TensorList argument, or -1
  std::vector<Placement> placements;  // placements of the local tensor on the stack
  const TensorMeta* meta = nullptr;   // global metadata
};

// Runs `op` (NOTE: [Random ops on DTensors]) on the stack the fallback prepared: arguments
// from `begin` on, DTensor arguments as local tensors with `inputs`' placements. Leaves the
// op's returns on the stack as local tensors with `outputs`' placements (a written argument's
// return is its local tensor, updated in place). May be collective (the tracker's first use).
void run_random_op(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin, const DeviceMesh& mesh,
                   const std::vector<RandomOpInput>& inputs, const std::vector<std::vector<Placement>>& outputs,
                   int written_arg);

// Whether `op` ("aten::native_dropout") is run through a re-expression that takes a generator
// (NOTE: [Random ops on DTensors]); the fallback also infers its output metadata that way.
bool has_random_reexpression(const std::string& op);
// Runs that re-expression on the stack (arguments from `begin` on; returns left on it).
void run_random_reexpression(const std::string& op, torch::jit::Stack* stack, size_t begin,
                             const at::Generator& generator);

}  // namespace detail
}  // namespace dtensor
