// dtensor/experimental/experimental.h: umbrella header of dtensor::experimental (PyTorch's
// torch.distributed.tensor.experimental): local_map, context parallel (context_parallel, its
// head-tail load balancer and ring attention).
#pragma once
#include "dtensor/experimental/context_parallel.h"
#include "dtensor/experimental/load_balancer.h"
#include "dtensor/experimental/local_map.h"
#include "dtensor/experimental/ring_attention.h"
