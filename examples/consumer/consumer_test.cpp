// A user's suite against the installed package: 4 ranks as processes (gloo) and as threads,
// and the README's example.
#include <dtensor/comm/comm.h>
#include <dtensor/tensor/dtensor.h>
#include <harness/harness.h>

#include <ATen/ATen.h>

class MyProcessTest : public dtensor::testing::MultiProcessTest {};
class MyThreadTest : public dtensor::testing::MultiThreadedTest {};

DTENSOR_TEST_F(MyProcessTest, AllReduceSumsRanks) {
  at::Tensor t = at::full({2}, rank(), at::kFloat);
  group().all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), 6.0f);
}

DTENSOR_TEST_F(MyThreadTest, AllGatherCollectsRanks) {
  at::Tensor out = at::empty({4}, at::kLong);
  group().all_gather_into(out, at::full({1}, rank(), at::kLong));
  EXPECT_TRUE(at::equal(out, at::arange(4, at::kLong)));
}

// DTensor through the installed package: every sharding of add's inputs gives the plain result.
class MyOpTest : public dtensor::testing::DTensorOpTestBase {};

DTENSOR_TEST_F(MyOpTest, AddUnderEveryPlacement) {
  auto mesh = build_device_mesh();
  at::Tensor a = at::arange(32, at::kFloat).reshape({8, 4});
  test_op(mesh, "aten::add", "Tensor", {a, a * 2, 1});
}

// The README's example, as written there (it must compile and pass as a user would use it).
class MatmulTest : public dtensor::testing::DTensorTestBase {};   // 4 ranks, processes, gloo

DTENSOR_TEST_F(MatmulTest, ColumnShardedWeight) {                 // the body runs in every rank
  auto mesh = build_device_mesh();                                 // 1-D, every rank
  at::manual_seed(0);                                              // the same inputs everywhere
  at::Tensor x = at::randn({8, 16});
  at::Tensor w = at::randn({16, 4 * ranks()});
  at::Tensor dx = dtensor::distribute_tensor(x, mesh, {dtensor::Replicate{}});
  at::Tensor dw = dtensor::distribute_tensor(w, mesh, {dtensor::Shard{1}});
  at::Tensor y = at::mm(dx, dw);                                   // a DTensor, no communication
  EXPECT_TRUE(dtensor::is_shard(dtensor::get_spec(y).placements[0], 1));
  EXPECT_TRUE(at::allclose(dtensor::full_tensor(y).cpu(), at::mm(x, w)));
  test_op(mesh, "aten::mm", "", {x, w});                           // every sharding of x and w
}
