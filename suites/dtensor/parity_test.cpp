// PyTorch parity of the DTensor API, written as PyTorch's own tests are
// (test/distributed/tensor/test_dtensor.py, test_redistribute.py, test_pointwise_ops.py,
// common_dtensor.py): the same inputs, placements, expected placements, values and collective
// counts.
#include "dtensor/comm/comm.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <sstream>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

using testing::contains;
using testing::error_of;

class Parity : public testing::MultiThreadedTest {};

// PyTorch's repr of a 1-D rank list: "[0, 2]".
std::string py_list(const at::Tensor& ranks) {
  std::string s = "[";
  for (int64_t i = 0; i < ranks.numel(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i].item<int64_t>());
  return s + "]";
}
class ParityGloo : public testing::MultiProcessTest {};

// ---- 12. Redistributing to Partial is refused (test_redistribute.py test_replicate_to_partial) --

DTENSOR_TEST_F(Parity, RedistributeRefusesPartialTargets) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  at::Tensor local = at::arange(36, at::kFloat).reshape({12, 3}).requires_grad_(true);
  at::Tensor replica = distribute_tensor(local, mesh, {Replicate{}});
  EXPECT_PRED2(contains, error_of([&] { redistribute(replica, mesh, {Partial{}}); }),
               "Can not redistribute from Replicate() to Partial(sum)");
  at::Tensor shard = distribute_tensor(local, mesh, {Shard{0}});
  EXPECT_PRED2(contains, error_of([&] { redistribute(shard, {Partial{}}); }),
               "Can not redistribute from Shard(dim=0) to Partial(sum)");
  at::Tensor partial = from_local(at::ones({3, 3}), mesh, {Partial{}});
  EXPECT_PRED2(contains, error_of([&] { redistribute(partial, {Partial(comm::ReduceOp::AVG)}); }),
               "Can not redistribute from Partial(sum) to Partial(avg)");
  // The same Partial is no move at all.
  counting.reset();
  EXPECT_EQ(get_spec(redistribute(partial, {Partial{}})).placements, std::vector<Placement>{Partial{}});
  EXPECT_EQ(counting.collectives(), 0);
  // The internal transition (PyTorch's Redistribute.apply) still exists, without communication.
  counting.reset();
  at::Tensor p = detail::redistribute_to_any(replica, {Partial{}});
  EXPECT_EQ(p.sizes(), local.sizes());
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_TRUE(at::allclose(full_tensor(p), local));
}

// ---- 13. The gradient of a Partial input stays Partial, with no collective ---------------------

DTENSOR_TEST_F(Parity, PartialInputGradientStaysPartial) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  at::Tensor local = at::full({2, 3}, rank() + 1.0).requires_grad_(true);
  at::Tensor x = from_local(local, mesh, {Partial{}});
  at::Tensor y = x * 2;  // linear: stays Partial
  ASSERT_EQ(get_spec(y).placements, std::vector<Placement>{Partial{}});
  at::Tensor out = to_local(y);  // its gradient comes back Partial (to_local's default hint)
  counting.reset();
  out.sum().backward();
  // Each rank's share of the gradient: no all_reduce (PyTorch keeps Partial -> Partial).
  EXPECT_EQ(counting.collectives(), 0) << c10::str(counting.counts().size());
  EXPECT_TRUE(at::equal(local.grad(), at::full({2, 3}, 2.0)));

  // A Replicate gradient of a Partial input becomes Replicate (no Replicate -> Partial).
  at::Tensor leaf = DTensor(at::full({2, 3}, rank() + 1.0f), get_spec(x), true);
  at::Tensor r = redistribute(leaf, {Replicate{}});
  EXPECT_TRUE(at::equal(local_tensor(r), at::full({2, 3}, ranks() * (ranks() + 1) / 2.0)));  // 1 + ... + n
  counting.reset();
  (r * 3).sum().backward();
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_EQ(get_spec(leaf.grad()).placements, std::vector<Placement>{Replicate{}});
  EXPECT_TRUE(at::equal(local_tensor(leaf.grad()), at::full({2, 3}, 3.0)));
}

// ---- 14. run_check checks requires_grad (PyTorch's check_tensor_meta) -------------------------

DTENSOR_TEST_F(Parity, FromLocalRunCheckComparesRequiresGradAndBroadcastsReplicas) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor local = at::ones({2, 3}).requires_grad_(rank() != 1);
  EXPECT_PRED2(contains, error_of([&] { from_local(local, mesh, {Shard{0}}, /*run_check=*/true); }),
               "rank 1 passed a local tensor with requires_grad=false but rank 0 with requires_grad=true");
  // Uneven local shapes need the global shape (check_tensor_meta compares shapes): 2n - 1
  // rows are 2 per rank and 1 on the last.
  const int last = ranks() - 1;
  const int64_t rows = 2 * ranks() - 1;
  at::Tensor uneven = at::ones({rank() < last ? 2 : 1, 2});
  EXPECT_PRED2(contains, error_of([&] { from_local(uneven, mesh, {Shard{0}}, true); }),
               "the local tensors are uneven (dim 0: rank " + std::to_string(last) + " has size 1, rank 0 has 2)");
  FromLocalOptions o;
  o.run_check = true;
  o.shape = std::vector<int64_t>{rows, 2};
  o.stride = std::vector<int64_t>{2, 1};
  EXPECT_EQ(from_local(uneven, mesh, {Shard{0}}, o).sizes(), (c10::IntArrayRef{rows, 2}));
  // Replicate: the first rank's values reach every rank; the caller's tensor is untouched.
  at::Tensor mine = at::full({2}, static_cast<double>(rank()));
  at::Tensor rep = from_local(mine, mesh, {Replicate{}}, true);
  EXPECT_TRUE(at::equal(local_tensor(rep), at::zeros({2})));
  EXPECT_EQ(mine[0].item<double>(), rank());
}

// ---- 15. A one-element plain tensor is replicated implicitly ---------------------------------

DTENSOR_TEST_F(Parity, OneElementPlainTensorsAreReplicatedImplicitly) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor g = at::arange(32, at::kFloat).reshape({8, 4});
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  for (at::Tensor scalar : {at::full({1}, 2.0f), at::full({1, 1}, 2.0f), at::full({}, 2.0f)}) {
    SCOPED_TRACE(c10::str(scalar.sizes()));
    at::Tensor y = x * scalar;
    ASSERT_TRUE(is_dtensor(y));
    EXPECT_EQ(get_spec(y).placements, std::vector<Placement>{Shard{0}});
    EXPECT_TRUE(at::equal(full_tensor(y), g * scalar));
  }
  // More than one element is still an error (PyTorch: "got mixed torch.Tensor and DTensor").
  EXPECT_PRED2(contains, error_of([&] { (void)(x * at::ones({4})); }), "mixed with DTensors");
}

// ---- 16. fill_ and zero_ on a Partial tensor keep it Partial, with the single-device value ----
// (NOTE: [Filling a Partial tensor]: PyTorch leaves v on every rank, which a Partial(sum)
// reduces to v * ranks.)

DTENSOR_TEST_F(Parity, FillOnPartialKeepsPartial) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MAX, comm::ReduceOp::MIN}) {
    SCOPED_TRACE(comm::to_string(op));
    at::Tensor p = from_local(at::full({3, 2}, rank() + 1.0f), mesh, {Partial(op)});
    p.fill_(3);
    EXPECT_EQ(get_spec(p).placements, std::vector<Placement>{Partial(op)});
    EXPECT_TRUE(at::equal(full_tensor(p), at::full({3, 2}, 3.0f)));
    p.zero_();
    EXPECT_EQ(get_spec(p).placements, std::vector<Placement>{Partial(op)});
    EXPECT_TRUE(at::equal(full_tensor(p), at::zeros({3, 2})));
  }
  // On a 2-D mesh a Partial(sum) on either mesh dim, or both, reduces to the value.
  if (ranks() % 2 != 0) return;
  auto mesh2 = init_device_mesh(device_type(), {2, ranks() / 2});
  for (auto ps : {std::vector<Placement>{Partial{}, Shard{0}}, std::vector<Placement>{Shard{1}, Partial{}},
                  std::vector<Placement>{Partial{}, Partial(comm::ReduceOp::MAX)}, std::vector<Placement>{Partial{}, Partial{}}}) {
    at::Tensor p = from_local(at::full({4, 2}, rank() + 1.0f), mesh2, ps);
    p.fill_(2.5);
    EXPECT_EQ(get_spec(p).placements, ps);
    const at::Tensor whole = full_tensor(p);
    EXPECT_TRUE(at::equal(whole, at::full_like(whole, 2.5f))) << whole;
  }
}

// ---- 17. run_subtests: any printable value, and a barrier after each subtest -------------------

DTENSOR_TEST_F(Parity, RunSubtestsTakesPrintableValuesAndBarriers) {
  testing::CallCounter calls;  // barriers included
  std::vector<std::string> seen;
  int n = testing::run_subtests(
      {{"dtype", {at::kFloat, at::kDouble}},
       {"placements", {std::vector<Placement>{Shard{0}}, std::vector<Placement>{Replicate{}}}},
       {"sizes", {std::vector<int64_t>{2, 3}}}},
      [&](const testing::SubtestParams& p) {
        seen.push_back(p.to_string());
        at::Tensor t = at::zeros(p.get<std::vector<int64_t>>("sizes"), p.get<at::ScalarType>("dtype"));
        EXPECT_EQ(t.scalar_type(), p.get<at::ScalarType>("dtype"));
        EXPECT_EQ(p.get<std::vector<Placement>>("placements").size(), 1u);
      });
  EXPECT_EQ(n, 4);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen.front(), "dtype=Float, placements=[Shard(dim=0)], sizes=[2, 3]");
  EXPECT_EQ(seen.back(), "dtype=Double, placements=[Replicate()], sizes=[2, 3]");
  EXPECT_EQ(calls.calls, (std::map<std::string, int>{{"barrier", 4}}));
  testing::SubtestValue v(at::kFloat);
  EXPECT_PRED2(contains, error_of([&] { v.get<int64_t>(); }), "subtest value Float is a c10::ScalarType");
}

// ---- 18. A misspelled DTENSOR_BACKEND fails, naming the valid backends --------------------------

TEST(ParityBackendName, MisspelledBackendFails) {
  EXPECT_EQ(testing::backend_name_error("gloo"), "");
  EXPECT_EQ(testing::backend_name_error("cpu:gloo,cuda:nccl"), "");
  EXPECT_PRED2(contains, testing::backend_name_error("glo"),
               "DTENSOR_BACKEND='glo' names no backend ('glo'); valid backends are gloo, nccl or mpi");
  EXPECT_PRED2(contains, testing::backend_name_error("cpu:gloo,cuda:nccI"), "('nccI')");
  // As a user sees it: the multi-process test fails instead of skipping.
  auto run = testing::run_self({"--gtest_filter=ParityGloo.OneRankBody"}, {{"DTENSOR_BACKEND", "glo"}});
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_PRED2(contains, run.output, "names no backend ('glo')");
  EXPECT_FALSE(contains(run.output, "[  SKIPPED ]")) << run.output;
}
DTENSOR_TEST_F(ParityGloo, OneRankBody) { EXPECT_GE(rank(), 0); }

// ---- 1. grad_placements (test_dtensor.py test_full_tensor_grad_hint, test_to_local) -----------

DTENSOR_TEST_F(Parity, FullTensorGradHint) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor global = at::ones({8, 3}).requires_grad_(true);
  at::Tensor sharded = distribute_tensor(global, mesh, {Shard{0}});
  at::Tensor local_out = full_tensor(sharded, std::vector<Placement>{Partial{}});
  local_out.sum().backward();
  at::Tensor replica_grad = full_tensor(sharded.grad());
  EXPECT_TRUE(at::equal(replica_grad, global.detach() * ranks()));
}

DTENSOR_TEST_F(Parity, ToLocalGradPlacements) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor x = distribute_tensor(at::ones({8, 3}).requires_grad_(true), mesh, {Replicate{}});
  // The local result is used as a Partial (e.g. fed to a row-parallel matmul): each rank's
  // gradient is a share, and the gradient of x is their sum.
  at::Tensor local = to_local(x, std::vector<Placement>{Partial{}});
  (local * (rank() + 1)).sum().backward();
  // The leaf keeps the gradient as the hint lays it out (PyTorch: x.grad is Partial).
  EXPECT_EQ(get_spec(x.grad()).placements, std::vector<Placement>{Partial{}});
  EXPECT_TRUE(at::equal(local_tensor(x.grad()), at::full({8, 3}, rank() + 1.0f)));
  EXPECT_TRUE(at::equal(full_tensor(x.grad()), at::full({8, 3}, ranks() * (ranks() + 1) / 2.0f)));
  // Without the hint the gradient is taken as laid out like x (Replicate): no reduction.
  at::Tensor y = distribute_tensor(at::ones({8, 3}).requires_grad_(true), mesh, {Replicate{}});
  (to_local(y) * (rank() + 1)).sum().backward();
  EXPECT_TRUE(at::equal(local_tensor(y.grad()), at::full({8, 3}, rank() + 1.0f)));
}

// ---- 2. redistribute options (test_redistribute.py
//         test_shard_to_replicate_forward_backward_datatype_conversion) -------------------------

DTENSOR_TEST_F(Parity, RedistributeForwardBackwardDtypes) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  const std::vector<std::optional<at::ScalarType>> forward = {std::nullopt, at::kFloat, at::kDouble, at::kDouble};
  const std::vector<std::optional<at::ScalarType>> backward = {std::nullopt, at::kDouble, at::kFloat, at::kDouble};
  for (size_t i = 0; i < forward.size(); ++i) {
    SCOPED_TRACE(i);
    at::Tensor input = at::arange(36, at::kFloat).reshape({12, 3}).div(7).requires_grad_(true);
    at::Tensor sharded = distribute_tensor(input, mesh, {Shard{0}});
    RedistributeOptions o;
    o.forward_dtype = forward[i];
    o.backward_dtype = backward[i];
    counting.reset();
    at::Tensor replica = redistribute(sharded, mesh, {Replicate{}}, o);
    EXPECT_EQ(replica.sizes(), input.sizes());
    EXPECT_EQ(counting.collectives(), 1);
    EXPECT_EQ(counting.counts()[funcol::all_gather_into_tensor], 1);
    EXPECT_EQ(local_tensor(replica).scalar_type(), forward[i].value_or(at::kFloat));
    EXPECT_TRUE(at::allclose(local_tensor(replica).to(at::kFloat), input.detach()));
    counting.reset();
    replica.backward(at::ones_like(replica));
    EXPECT_EQ(counting.collectives(), 0);  // Replicate -> Shard is a local chunk
    at::Tensor grad = sharded.grad();
    EXPECT_EQ(get_spec(grad).placements, std::vector<Placement>{Shard{0}});
    EXPECT_EQ(local_tensor(grad).scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(local_tensor(grad), at::ones(local_tensor(sharded).sizes())));
  }
  // async_op is accepted; the result is complete on return.
  RedistributeOptions async;
  async.async_op = true;
  at::Tensor g = at::arange(8, at::kFloat);
  EXPECT_TRUE(at::equal(full_tensor(redistribute(distribute_tensor(g, mesh, {Shard{0}}), {Replicate{}}, async)), g));
}

// ---- 3. from_local shape and stride (test_dtensor.py test_from_local_uneven_sharding,
//         test_from_local_uneven_sharding_raise_error) --------------------------------------------

DTENSOR_TEST_F(Parity, FromLocalShapeAndStride) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor global = at::arange(10, at::kFloat).reshape({5, 2});
  auto pieces = split_tensor(Shard{0}, global, ranks());
  FromLocalOptions o;
  o.shape = global.sizes().vec();
  o.stride = global.strides().vec();
  at::Tensor dt = from_local(pieces[static_cast<size_t>(rank())], mesh, {Shard{0}}, o);
  EXPECT_EQ(dt.sizes(), global.sizes());
  EXPECT_EQ(dt.strides(), global.strides());
  EXPECT_TRUE(at::equal(full_tensor(dt), global));
  FromLocalOptions only_shape;
  only_shape.shape = global.sizes().vec();
  EXPECT_PRED2(contains, error_of([&] { from_local(pieces[static_cast<size_t>(rank())], mesh, {Shard{0}}, only_shape); }),
               "pass both shape and stride, or neither");
  FromLocalOptions only_stride;
  only_stride.stride = global.strides().vec();
  EXPECT_PRED2(contains, error_of([&] { from_local(pieces[static_cast<size_t>(rank())], mesh, {Shard{0}}, only_stride); }),
               "pass both shape and stride, or neither");
  // A permuted local tensor gives PyTorch's global strides (compute_global_tensor_info).
  at::Tensor permuted = at::arange(8, at::kFloat).reshape({4, 2}).t();  // [2, 4], strides [1, 2]
  at::Tensor p = from_local(permuted, mesh, {Shard{0}});
  EXPECT_EQ(p.sizes(), (c10::IntArrayRef{2 * ranks(), 4}));
  EXPECT_EQ(p.strides(), (c10::IntArrayRef{1, 2 * ranks()}));
  EXPECT_TRUE(at::equal(full_tensor(p + 1), at::cat(std::vector<at::Tensor>(ranks(), permuted)) + 1));
}

// ---- 4. The DTensor constructor: no communication ---------------------------------------------

DTENSOR_TEST_F(Parity, DTensorConstructor) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  DTensorSpec spec(mesh, {Shard{0}}, TensorMeta{{2 * ranks(), 2}, {2, 1}, at::kFloat});
  at::Tensor local = at::full({2, 2}, static_cast<float>(rank()));
  counting.reset();
  at::Tensor dt = DTensor(local, spec, /*requires_grad=*/true);
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_TRUE(dt.requires_grad());
  EXPECT_TRUE(dt.is_leaf());
  EXPECT_EQ(get_spec(dt), spec);
  EXPECT_TRUE(at::equal(local_tensor(dt), local));
  EXPECT_PRED2(contains, error_of([&] { (void)DTensor(at::ones({3, 2}), spec, false); }),
               "is not this rank's shard of");
  EXPECT_PRED2(contains, error_of([&] { (void)DTensor(at::ones({2, 2}, at::kDouble), spec, false); }),
               "the local tensor is Double but the spec says Float");
}

// ---- 6. The current mesh (PyTorch's `with mesh:`) ----------------------------------------------

DTENSOR_TEST_F(Parity, DeviceMeshGuardMakesTheMeshOptional) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  auto mesh2 = init_device_mesh(device_type(), mesh_shape_2d());
  EXPECT_FALSE(has_current_mesh());
  EXPECT_PRED2(contains, error_of([&] { distribute_tensor(at::ones({4}), {Shard{0}}); }), "no current DeviceMesh");
  {
    DeviceMeshGuard use(mesh);
    at::Tensor x = distribute_tensor(at::ones({8, 2}), {Shard{0}});
    EXPECT_EQ(get_spec(x).mesh, mesh);
    at::Tensor r = distribute_tensor(at::ones({8, 2}));  // Replicate by default
    EXPECT_EQ(get_spec(r).placements, std::vector<Placement>{Replicate{}});
    {
      DeviceMeshGuard inner(mesh2);
      at::Tensor y = from_local(at::ones({2, 2}), {Shard{0}, Replicate{}});
      EXPECT_EQ(get_spec(y).mesh, mesh2);
      EXPECT_EQ(y.sizes(), (c10::IntArrayRef{ranks(), 2}));
    }
    EXPECT_EQ(current_mesh(), mesh);
  }
  EXPECT_FALSE(has_current_mesh());
}

// ---- 7. Placement helpers (test_dtensor.py / test_utils.py test_split_tensor_1D,
//         test_redistribute.py shard_dim_alltoall, distribute_tensor src_data_rank) -------------

TEST(ParityPlacementHelpers, SplitTensorAndUnpad) {
  const int64_t world = 4;
  for (int64_t size = 0; size < 8; ++size) {
    SCOPED_TRACE(size);
    at::Tensor tensor = at::arange(size, at::kFloat);
    std::vector<int64_t> pad_sizes;
    auto padded = split_tensor(Shard{0}, tensor, world, /*with_padding=*/true, &pad_sizes);
    ASSERT_EQ(padded.size(), 4u);
    ASSERT_EQ(pad_sizes.size(), 4u);
    const int64_t chunk = (size + world - 1) / world;
    std::vector<at::Tensor> unpadded;
    std::vector<bool> empty, expected_empty;
    auto chunks = tensor.chunk(world);
    for (int64_t i = 0; i < world; ++i) {
      EXPECT_EQ(padded[static_cast<size_t>(i)].size(0), chunk);
      unpadded.push_back(unpad_tensor(Shard{0}, padded[static_cast<size_t>(i)], pad_sizes[static_cast<size_t>(i)]));
      empty.push_back(unpadded.back().numel() == 0);
      expected_empty.push_back(i >= static_cast<int64_t>(chunks.size()) || chunks[static_cast<size_t>(i)].numel() == 0);
    }
    EXPECT_EQ(empty, expected_empty);
    EXPECT_TRUE(at::equal(at::cat(unpadded), tensor));
    EXPECT_EQ(split_tensor(Shard{0}, tensor, world).size(), 4u);
  }
}

DTENSOR_TEST_F(Parity, ShardDimAlltoall) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  const int64_t n = ranks();
  at::Tensor global = at::arange(6 * n * n, at::kFloat).reshape({2 * n, 3 * n});
  at::Tensor local = global.chunk(n, 0)[static_cast<size_t>(rank())];
  counting.reset();
  at::Tensor out = shard_dim_alltoall(local, 0, 1, mesh, 0);
  EXPECT_EQ(counting.collectives(), 1);
  EXPECT_EQ(counting.counts()[funcol::all_to_all_single], 1);
  EXPECT_TRUE(at::equal(out, global.chunk(n, 1)[static_cast<size_t>(rank())]));
}

DTENSOR_TEST_F(Parity, ShardTensorAndSrcDataRank) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  const int64_t n = ranks(), rows = 2 * n - 1;  // uneven: 2 rows per rank, 1 on the last
  at::Tensor global = at::arange(2 * rows, at::kFloat).reshape({rows, 2});
  at::Tensor mine = global + rank();  // every rank passes different values
  counting.reset();
  at::Tensor local_only = _shard_tensor(mine, {Shard{0}}, mesh);
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_TRUE(at::equal(local_tensor(local_only), mine.chunk(n, 0)[static_cast<size_t>(rank())]));
  EXPECT_EQ(local_only.sizes(), (c10::IntArrayRef{rows, 2}));
  counting.reset();
  const int64_t last = n - 1;
  at::Tensor from_last = distribute_tensor(mine, mesh, {Shard{0}}, /*src_data_rank=*/last);
  EXPECT_EQ(counting.counts()[funcol::broadcast], 1);
  EXPECT_TRUE(at::equal(full_tensor(from_last), global + last));
  EXPECT_TRUE(at::equal(full_tensor(distribute_tensor(mine, mesh, {Replicate{}})), global));
  EXPECT_PRED2(contains, error_of([&] { distribute_tensor(mine, mesh, {Shard{0}}, n); }),
               "src_data_rank " + std::to_string(n) + " is not a coordinate of mesh dim 0 (size " +
                   std::to_string(n) + ")");
}

// ---- distribute_tensor to Partial (PyTorch: replicate, then Partial._partition_value) --------

DTENSOR_TEST_F(Parity, DistributeTensorToPartialPartitionsTheValue) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  testing::CommCounter counting;  // this rank's collectives
  const at::Tensor x = at::arange(8, at::kFloat).reshape({2, 4});
  at::Tensor sum = distribute_tensor(x, mesh, {Partial{}});
  EXPECT_EQ(get_spec(sum).placements, std::vector<Placement>{Partial{}});
  EXPECT_TRUE(at::equal(local_tensor(sum), x / ranks()));  // _partition_value: tensor / num_chunks
  EXPECT_TRUE(at::allclose(full_tensor(sum), x));
  for (auto op : {comm::ReduceOp::AVG, comm::ReduceOp::MAX, comm::ReduceOp::MIN}) {
    SCOPED_TRACE(comm::to_string(op));
    at::Tensor p = distribute_tensor(x, mesh, {Partial(op)});
    EXPECT_TRUE(at::equal(local_tensor(p), x));
    EXPECT_TRUE(at::equal(full_tensor(p), x));
  }
  // Integers: the value on the first rank, zeros elsewhere (exact; the dtype stays).
  const at::Tensor xi = at::arange(8, at::kLong);
  at::Tensor pi = distribute_tensor(xi, mesh, {Partial{}});
  EXPECT_TRUE(at::equal(local_tensor(pi), rank() == 0 ? xi : at::zeros_like(xi)));
  EXPECT_TRUE(at::equal(full_tensor(pi), xi));
  // 2-D: Partial on one dim, Shard on the other.
  auto mesh2 = init_device_mesh(device_type(), mesh_shape_2d());
  const at::Tensor y = at::arange(16, at::kFloat).reshape({4, 4});
  at::Tensor ps = distribute_tensor(y, mesh2, {Partial{}, Shard{0}});
  EXPECT_TRUE(at::equal(local_tensor(ps), y.chunk(2, 0)[static_cast<size_t>(rank() % 2)] / mesh2.size(0)));
  EXPECT_TRUE(at::allclose(full_tensor(ps), y));
}

// ---- 8. libtorch's serialization of a DTensor raises, saying how to save it -------------------

DTENSOR_TEST_F(Parity, TorchSaveOfADTensorSaysHowToSaveIt) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor dt = distribute_tensor(at::ones({4, 2}), mesh, {Shard{0}});
  std::ostringstream os;
  const std::string err = error_of([&] { torch::save(dt, os); });
  EXPECT_PRED2(contains, err, "Cannot access storage of DTensorImpl (a DTensor has no storage of its own, so "
                              "libtorch's serialization (torch::save, pickle_save) cannot save it: save its local "
                              "shard (dtensor::to_local) on every rank");
  torch::nn::Linear lin(2, 2);
  nn::swap_parameter(*lin, "weight", distribute_tensor(lin->weight.detach(), mesh, {Shard{0}}));
  std::ostringstream os2;
  const std::string err2 = error_of([&] { torch::save(lin, os2); });
  EXPECT_PRED2(contains, err2, "dtensor::checkpoint::save(dtensor::checkpoint::get_model_state_dict(module), dir)");

  // torch::load of a whole-tensor checkpoint into a module with DTensor parameters: each rank
  // keeps its piece and the placements stay (NOTE: [Loading into DTensors]).
  torch::nn::Linear plain(2, 3);
  {
    at::NoGradGuard no_grad;
    plain->weight.copy_(at::arange(6, at::kFloat).reshape({3, 2}));
    plain->bias.copy_(at::arange(3, at::kFloat) * 10);
  }
  std::stringstream saved;
  torch::save(plain, saved);
  torch::nn::Linear target(2, 3);
  nn::swap_parameter(*target, "weight", distribute_tensor(at::zeros({3, 2}), mesh, {Shard{0}}));
  nn::swap_parameter(*target, "bias", distribute_tensor(at::zeros({3}), mesh, {Replicate{}}));
  torch::load(target, saved);
  EXPECT_EQ(get_spec(target->weight).placements, std::vector<Placement>{Shard{0}});
  EXPECT_EQ(get_spec(target->bias).placements, std::vector<Placement>{Replicate{}});
  // torch.chunk of 3 rows over the ranks (on 4: one row each on ranks 0-2, none on rank 3).
  const at::Tensor whole = at::arange(6, at::kFloat).reshape({3, 2});
  const std::vector<at::Tensor> rows = whole.chunk(ranks(), 0);
  EXPECT_TRUE(at::equal(local_tensor(target->weight),
                        rank() < static_cast<int>(rows.size()) ? rows[static_cast<size_t>(rank())] : whole.narrow(0, 3, 0)));
  EXPECT_TRUE(at::equal(full_tensor(target->weight), plain->weight));
  EXPECT_TRUE(at::equal(full_tensor(target->bias), plain->bias));
  // A checkpoint of another shape is refused, naming both.
  torch::nn::Linear other(2, 5);
  std::stringstream saved_other;
  torch::save(other, saved_other);
  EXPECT_PRED2(contains, error_of([&] { torch::load(target, saved_other); }),
               "torch::load can fill a DTensor only from the whole (unsharded) tensor of the same shape and dtype");
}

// ---- 5. DTensors on a mesh over a subset of the world (test_dtensor.py DTensorMeshTest
// test_from_local_sub_mesh, test_default_value_sub_mesh, test_redistribute_sub_mesh) -----------

// The even ranks, the sub-mesh of the tests below (PyTorch's [0, 2] on 4 ranks).
at::Tensor even_ranks(int64_t n) { return at::arange(0, n, 2, at::kLong); }

// The local tensor on the even ranks (the mesh), an empty one elsewhere.
void expect_sub_mesh_local(int rank, const at::Tensor& expected_in_mesh, const at::Tensor& local) {
  if (rank % 2 == 0) {
    EXPECT_TRUE(at::equal(local, expected_in_mesh)) << local;
  } else {
    EXPECT_EQ(local.sizes(), (c10::IntArrayRef{0})) << local;
    EXPECT_EQ(local.scalar_type(), expected_in_mesh.scalar_type());
  }
}

DTENSOR_TEST_F(Parity, SubMeshFromLocalOpsAndRedistribute) {
  testing::CommCounter counting;
  DeviceMesh mesh(device_type(), even_ranks(ranks()), {}, group_ptr());
  const int64_t m = mesh.size();
  counting.reset();
  at::Tensor dt = from_local(at::ones({3, 4}), mesh, {Shard{0}});
  EXPECT_EQ(dt.sizes(), (c10::IntArrayRef{3 * m, 4}));
  expect_sub_mesh_local(rank(), at::ones({3, 4}), to_local(dt));
  // Only the mesh's ranks compute.
  at::Tensor plus = dt + 2;
  EXPECT_EQ(plus.sizes(), (c10::IntArrayRef{3 * m, 4}));
  EXPECT_EQ(get_spec(plus).placements, std::vector<Placement>{Shard{0}});
  expect_sub_mesh_local(rank(), at::ones({3, 4}) + 2, to_local(plus));
  // Redistribute on the submesh: ranks outside it communicate nothing.
  at::Tensor sharded = from_local(at::ones({4, 3}), mesh, {Shard{0}});
  at::Tensor replicated = redistribute(sharded, {Replicate{}});
  expect_sub_mesh_local(rank(), at::ones({4 * m, 3}), to_local(replicated));
  at::Tensor again = redistribute(replicated, {Shard{0}});
  expect_sub_mesh_local(rank(), at::ones({4, 3}), to_local(again));
  expect_sub_mesh_local(rank(), at::ones({4 * m, 3}), full_tensor(again));
  // A matmul and a reduction with a gradient, on the members only.
  at::Tensor w = distribute_tensor(at::ones({3, 2}), mesh, {Replicate{}}).requires_grad_(true);
  at::Tensor y = at::mm(sharded, w);
  EXPECT_EQ(y.sizes(), (c10::IntArrayRef{4 * m, 2}));
  expect_sub_mesh_local(rank(), at::full({4, 2}, 3.0), to_local(y));
  y.sum().backward();
  ASSERT_TRUE(w.grad().defined());
  expect_sub_mesh_local(rank(), at::full({3, 2}, 4.0 * m), full_tensor(w.grad()));
  if (rank() % 2 == 1) EXPECT_EQ(counting.collectives(), 0);
  else if (m > 1) EXPECT_GT(counting.collectives(), 0);  // a mesh of one rank needs none
}

DTENSOR_TEST_F(Parity, SubMeshDefaultValues) {
  DeviceMesh mesh(device_type(), even_ranks(ranks()));
  at::Tensor a = from_local(at::ones({4, 3}), mesh, {Shard{0}});
  at::Tensor b = from_local(at::ones({4, 3}), mesh, {Shard{0}});
  EXPECT_TRUE(a.equal(b));  // a scalar result: true outside the mesh
  // A 0-dim result: a 0-dim zero outside the mesh.
  at::Tensor s = from_local(at::ones({4, 3}), mesh, {Shard{0}}).sum();
  EXPECT_EQ(s.dim(), 0);
  EXPECT_TRUE(at::equal(to_local(s), rank() % 2 == 0 ? at::scalar_tensor(12.0) : at::scalar_tensor(0.0)));
  // A list result: one empty local per element outside the mesh.
  at::Tensor c = from_local(at::ones({3, 4}), mesh, {Shard{0}});
  auto parts = c.split({2, 2}, 1);
  ASSERT_EQ(parts.size(), 2u);
  for (const auto& p : parts) {
    EXPECT_EQ(p.sizes(), (c10::IntArrayRef{3 * mesh.size(), 2}));
    expect_sub_mesh_local(rank(), at::ones({3, 2}), to_local(p));
  }
  // A non-tensor result that only the mesh can compute: a clear error outside it.
  at::Tensor one = distribute_tensor(at::ones({1}), mesh, {Replicate{}});
  if (rank() % 2 == 0) EXPECT_EQ(one.item<float>(), 1.0f);
  else
    EXPECT_PRED2(contains, error_of([&] { one.item<float>(); }),
                 "which is not in DeviceMesh('" + device_type() + "', " + py_list(even_ranks(ranks())) + ")");
}

DTENSOR_TEST_F(Parity, SubMeshDistributeTensorAndRunCheck) {
  DTENSOR_REQUIRE_WORLD_SIZE_AT_LEAST(4);  // a sub-mesh of two ranks or more, rank 0 not first
  testing::CommCounter counting;
  // The even ranks, descending: on 4 ranks [2, 0], rank 2 first.
  const at::Tensor members = even_ranks(ranks()).flip(0).contiguous();
  const int64_t first = members[0].item<int64_t>(), m = members.numel();
  DeviceMesh mesh(device_type(), members, {}, group_ptr());
  at::Tensor global = at::arange(12, at::kFloat).reshape({4, 3});
  counting.reset();
  at::Tensor dt = distribute_tensor(global + rank(), mesh, {Shard{0}}, /*src_data_rank=*/0);
  EXPECT_EQ(dt.sizes(), (c10::IntArrayRef{4, 3}));
  // The values of the mesh's first rank, each member holding the rows of its coordinate.
  if (rank() % 2 == 0) {
    const std::vector<at::Tensor> pieces = (global + first).chunk(m, 0);
    const size_t coordinate = static_cast<size_t>((first - rank()) / 2);
    const at::Tensor want = coordinate < pieces.size() ? pieces[coordinate] : global.narrow(0, 4, 0);
    EXPECT_TRUE(at::equal(to_local(dt), want)) << to_local(dt);
  } else {
    expect_sub_mesh_local(rank(), global, to_local(dt));
  }
  expect_sub_mesh_local(rank(), global + first, full_tensor(dt));
  if (rank() % 2 == 1) EXPECT_EQ(counting.collectives(), 0);
  // run_check among the mesh's ranks only: rank 0 differs from the mesh's first rank.
  at::Tensor local = at::ones({2, 3}).requires_grad_(rank() != 0);
  const std::string err = error_of([&] { from_local(local, mesh, {Shard{0}}, /*run_check=*/true); });
  if (rank() % 2 == 0)
    EXPECT_PRED2(contains, err, "rank 0 passed a local tensor with requires_grad=false but rank " +
                                    std::to_string(first) + " with requires_grad=true");
  else
    EXPECT_EQ(err, "<no error>");
  // Replicate with run_check: the mesh's first rank's values.
  at::Tensor rep = from_local(at::full({2}, static_cast<double>(rank())), mesh, {Replicate{}}, true);
  expect_sub_mesh_local(rank(), at::full({2}, static_cast<double>(first)), to_local(rep));
}

}  // namespace
}  // namespace dtensor
