// dtensor/experimental/experimental.h: umbrella header of dtensor::experimental (PyTorch's
// torch.distributed.tensor.experimental): local_map.
#pragma once
#include "dtensor/experimental/local_map.h"
