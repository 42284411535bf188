// A user's suite against the installed package: 4 ranks as processes (gloo) and as threads.
#include <dtensor/comm/comm.h>
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
