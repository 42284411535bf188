// dtensor/fsdp/fsdp.h: umbrella header of dtensor::fsdp (FSDP2: fully_shard, FSDPModule,
// state dicts, the FSDP extensions).
#pragma once
#include "dtensor/fsdp/extensions.h"
#include "dtensor/fsdp/fully_shard.h"
#include "dtensor/fsdp/state_dict.h"
