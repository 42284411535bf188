// dtensor/fsdp/fsdp.h: umbrella header of dtensor::fsdp (FSDP2: fully_shard, FSDPModule,
// state dicts).
#pragma once
#include "dtensor/fsdp/fully_shard.h"
#include "dtensor/fsdp/state_dict.h"
