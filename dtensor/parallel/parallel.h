// dtensor/parallel/parallel.h: umbrella header of tensor parallelism (parallel styles and
// parallelize_module; torch.distributed.tensor.parallel).
#pragma once
#include "dtensor/parallel/api.h"
#include "dtensor/parallel/fused_matmul.h"
#include "dtensor/parallel/loss.h"
#include "dtensor/parallel/style.h"
