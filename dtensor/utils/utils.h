// dtensor/utils/utils.h: umbrella header of torch.distributed.utils' counterparts.
#pragma once
#include "dtensor/utils/containers.h"
#include "dtensor/utils/module_states.h"
#include "dtensor/utils/storage.h"
