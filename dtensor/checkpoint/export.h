// dtensor/checkpoint/export.h
//
// A checkpoint directory as files other tools read (not collective; one process):
//
//   auto sd = dtensor::checkpoint::load_full("/ckpt/step100");        // every key, whole
//   dtensor::checkpoint::export_torch_save("/ckpt/step100", "model.pt");
//   dtensor::checkpoint::export_safetensors("/ckpt/step100", "model.safetensors");
//
// - export_torch_save: one file that Python's torch.load reads as a dict {key: tensor or value}
//   (libtorch's torch::jit::pickle_save, the torch.save zip format).
// - export_safetensors: the safetensors format (8-byte little-endian header length, the JSON
//   header {key: {"dtype", "shape", "data_offsets"}}, then the bytes), tensors only; non-tensor
//   values go to the header's "__metadata__" as their pickled bytes' hex (safetensors metadata
//   holds strings only). complex dtypes are rejected (safetensors has none).
#pragma once

#include "dtensor/checkpoint/utils.h"

#include <string>

namespace dtensor {
namespace checkpoint {

// Every key of the checkpoint: tensors whole (plain), other values as saved.
StateDict load_full(const std::string& checkpoint_dir);

void export_torch_save(const std::string& checkpoint_dir, const std::string& out_file);
void export_safetensors(const std::string& checkpoint_dir, const std::string& out_file);

// The safetensors dtype name of one of ours ("F32" for "float32", ...); throws for complex.
std::string safetensors_dtype(const std::string& dtype);

}  // namespace checkpoint
}  // namespace dtensor
