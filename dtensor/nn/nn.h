// dtensor/nn/nn.h: umbrella header of dtensor::nn (module surgery, forward hooks and call(), DeviceContext,
// distribute_module, activation checkpointing, DTensor-aware functional ops, gradient clipping).
#pragma once
#include "dtensor/nn/checkpoint.h"
#include "dtensor/nn/clip_grad.h"
#include "dtensor/nn/device_context.h"
#include "dtensor/nn/distribute_module.h"
#include "dtensor/nn/functional.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
