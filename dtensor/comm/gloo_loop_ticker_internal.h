// dtensor/comm/gloo_loop_ticker_internal.h: makes a Gloo tcp device's loop tick fast while a
// group connects or closes (NOTE: [Gloo's loop ticks] in gloo_loop_ticker.cpp).
#pragma once

#include <memory>

namespace gloo {
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace dtensor {
namespace comm {

class LoopTicker {
 public:
  // A ticker on `device`'s loop, or nullptr when it is not a tcp device, when dtensor-cpp was
  // built without Gloo's headers, or with DTENSOR_GLOO_LOOP_TICKER=0.
  static std::unique_ptr<LoopTicker> attach(const std::shared_ptr<::gloo::transport::Device>& device);
  virtual ~LoopTicker() = default;
  // Ticking on / off.
  virtual void start() = 0;
  virtual void stop() = 0;
};

}  // namespace comm
}  // namespace dtensor
