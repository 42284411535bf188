// suites/dtensor/libtorch_compat_test.cpp: what dtensor-cpp assumes of the libtorch it is
// built against, checked on every libtorch line CI builds (Debian's 1.13, today's pip wheel).
#include "dtensor/compat.h"
#include "dtensor/tensor/dtensor_impl.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dtensor {
namespace {

// NOTE: [DTensor dispatch key] (dtensor/tensor/dtensor_impl.h): DTensors carry
// DispatchKey::Fake, which upstream marks for deletion. The key is ours only while libtorch
// registers nothing of its own on it: a kernel of libtorch's for some op on that key would run
// instead of our fallback for that op (and a fallback of libtorch's would make registering
// ours fail when the library loads). A new libtorch release that takes the key fails here,
// naming the ops, before any sharding test fails in a way that points elsewhere.
TEST(LibtorchCompat, TheDTensorKeyHasOurFallbackAndNoKernelOfLibtorchs) {
  auto& dispatcher = c10::Dispatcher::singleton();
  EXPECT_TRUE(dispatcher.hasBackendFallbackForDispatchKey(kDTensorKey))
      << "dtensor-cpp's fallback (dtensor/tensor/dispatch.cpp) is not registered on " << kDTensorKey;
  std::vector<std::string> taken;
  size_t ops = 0;
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op) continue;
    ++ops;
    if (op->hasKernelForDispatchKey(kDTensorKey)) taken.push_back(c10::toString(name));
  }
  EXPECT_GT(ops, 1000u) << "the dispatcher lists too few operators to say anything";
  std::string names;
  for (size_t i = 0; i < taken.size() && i < 20; ++i) names += " " + taken[i];
  EXPECT_TRUE(taken.empty()) << "libtorch " << compat::kTorchVersion << " registers kernels of its own on "
                             << kDTensorKey << " for " << taken.size() << " ops:" << names
                             << " (choose another key: NOTE: [DTensor dispatch key])";
}

}  // namespace
}  // namespace dtensor
