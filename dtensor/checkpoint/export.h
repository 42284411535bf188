// dtensor/checkpoint/export.h
//
// Checkpoints as files other tools read, and safetensors files read into sharded state dicts:
//
//   auto sd = dtensor::checkpoint::load_full("/ckpt/step100");        // every key, whole
//   dtensor::checkpoint::export_torch_save("/ckpt/step100", "model.pt");
//   dtensor::checkpoint::export_safetensors("/ckpt/step100", "model.safetensors");
//   // Hugging Face style: model-00001-of-00003.safetensors ... + model.safetensors.index.json
//   SafetensorsExportOptions split;
//   split.max_shard_bytes = int64_t(1) << 30;
//   dtensor::checkpoint::export_safetensors("/ckpt/step100", "out/model.safetensors", split);
//   // Any rank layout: each rank reads the bytes of its own shards (collective, like load).
//   StateDict sd{{"w", dtensor::zeros({4096, 4096}, mesh, {Shard{0}})}};
//   dtensor::checkpoint::load_safetensors(sd, "out/model.safetensors.index.json");
//
// - export_torch_save: one file that Python's torch.load reads as a dict {key: tensor or value},
//   with its default weights_only=True (torch >= 2.6) too: the pickle (libtorch's pickler, the
//   torch.save zip format) has no TorchScript type tags, and lists are plain Python lists.
// - export_safetensors: the safetensors format (8-byte little-endian header length, the JSON
//   header {key: {"dtype", "shape", "data_offsets"}}, then the bytes, 8-byte aligned), tensors
//   only; non-tensor values go to the header's "__metadata__" (of the first file when split) as
//   their pickled bytes' hex (safetensors metadata holds strings only), beside "format": "pt".
//   complex dtypes are rejected (safetensors has none). With max_shard_bytes > 0 the tensors
//   are split in key order into files of at most that many bytes (a larger tensor alone in its
//   file), named <stem>-00001-of-0000N.safetensors beside `out_file`, and `out_file` +
//   ".index.json" maps each key to its file ({"metadata": {"total_size": bytes}, "weight_map":
//   {key: file}}), as Hugging Face's split checkpoints (everything fitting in one file: just
//   `out_file`, no index, as they do too). Memory: one output file's tensors at a time.
// - load_safetensors: collective over the group of `options` (or one process). `path` is a
//   .safetensors file or a .index.json; each rank parses the headers and reads only the byte
//   ranges of its own shards (DTensors of any mesh and placements, ShardedTensors, plain
//   tensors; None placeholders receive the whole tensor). Non-tensor keys of the state dict are
//   read from "__metadata__" as export_safetensors wrote them; other metadata strings are not
//   keys. Errors (missing/unexpected keys under strict, dtype or shape mismatch, a malformed
//   header, a truncated file) raise CheckpointException on every rank naming the keys and files.
#pragma once

#include "dtensor/checkpoint/save_load.h"
#include "dtensor/checkpoint/utils.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {

// Every key of the checkpoint: tensors whole (plain), other values as saved.
StateDict load_full(const std::string& checkpoint_dir);

void export_torch_save(const std::string& checkpoint_dir, const std::string& out_file);

struct SafetensorsExportOptions {
  // 0: one file. Otherwise the most tensor bytes per file (Hugging Face's max_shard_size).
  int64_t max_shard_bytes = 0;
};
// Returns the files written (the index last when split).
std::vector<std::string> export_safetensors(const std::string& checkpoint_dir, const std::string& out_file,
                                            const SafetensorsExportOptions& options = {});

// Collective (see above). Fills `state_dict` in place.
LoadResult load_safetensors(StateDict& state_dict, const std::string& path, const LoadOptions& options = {});

// PyTorch's consolidate_safetensors_files: the sharded safetensors in `input_dir` (a save
// with CheckpointFormat::kHuggingFace, or PyTorch's HuggingFaceStorageWriter with
// save_distributed=True) as full tensors in `output_dir`: model-<i>-of-<N>.safetensors
// (fqn_to_index_mapping gives each key's file; empty: one file) and
// model.safetensors.index.json. Collective over the group of `options` (or one process): the
// chunks are split among the ranks, and each reads its chunks' bytes and writes them in place.
// The files are written under temporary names and renamed once every rank has written;
// output files of an earlier consolidation that this one does not write are removed. Only
// `process_group`, `no_dist`, `coordinator_rank` and `sync_files` of `options` are used.
// Returns the files written, the index last.
std::vector<std::string> consolidate_safetensors_files(const std::string& input_dir, const std::string& output_dir,
                                                       const std::map<std::string, int>& fqn_to_index_mapping = {},
                                                       const SaveOptions& options = {});

// The safetensors dtype name of one of ours ("F32" for "float32", ...); throws for complex.
std::string safetensors_dtype(const std::string& dtype);
// Ours for a safetensors name ("float32" for "F32"); throws naming unsupported ones (F8_*, ...).
std::string dtype_from_safetensors(const std::string& st_dtype);

}  // namespace checkpoint
}  // namespace dtensor
