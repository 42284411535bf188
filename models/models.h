// models/models.h: umbrella header of the reference models (namespace dtensor::models).
#pragma once
#include "models/mlp.h"
#include "models/rms_norm.h"
#include "models/transformer.h"
