// dtensor/comm/comm.h: umbrella header of the communication layer.
#pragma once
#include "dtensor/comm/work.h"
#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/group.h"
#include "dtensor/comm/object_collectives.h"
#include "dtensor/comm/rendezvous.h"
#include "dtensor/comm/thread_group.h"
