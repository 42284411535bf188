// dtensor/checkpoint/checkpoint.h: umbrella header of the distributed checkpoint (save, load) and its utilities.
#pragma once
#include "dtensor/checkpoint/api.h"
#include "dtensor/checkpoint/dist_wrapper.h"
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/file_view.h"
#include "dtensor/checkpoint/metadata.h"
#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/checkpoint/utils.h"
