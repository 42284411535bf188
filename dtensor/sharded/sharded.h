// dtensor/sharded/sharded.h: umbrella header of ShardedTensor and sharding (torch.distributed._shard).
#pragma once
#include "dtensor/sharded/api.h"
#include "dtensor/sharded/metadata.h"
#include "dtensor/sharded/sharded_tensor.h"
#include "dtensor/sharded/sharding_plan.h"
#include "dtensor/sharded/sharding_spec.h"
