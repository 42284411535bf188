// harness/harness.h: umbrella header of the test harness.
#pragma once
#include "harness/dtensor_test_base.h"
#include "harness/multi_rank_test.h"
#include "harness/subtests.h"
