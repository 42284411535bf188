// models/rms_norm.cpp
#include "models/rms_norm.h"

#include "dtensor/nn/module_surgery.h"

#include <ATen/ATen.h>

#include <mutex>

namespace dtensor {
namespace models {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps(eps) {
  static std::once_flag member_registered;
  std::call_once(member_registered, [] { nn::register_parameter_member<RMSNormImpl>("weight", &RMSNormImpl::weight); });
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return x * at::rsqrt(x.pow(2).mean({-1}, /*keepdim=*/true) + eps) * weight;
}

}  // namespace models
}  // namespace dtensor
