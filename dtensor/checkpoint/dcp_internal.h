// dtensor/checkpoint/dcp_internal.h: reading checkpoints that PyTorch's distributed
// checkpoint (torch.distributed.checkpoint, "DCP") wrote with its FileSystemWriter. Internal:
// read_metadata and load call it when a directory's `.metadata` is a Python pickle.
//
// PyTorch's layout: `.metadata` is pickle.dump of a torch.distributed.checkpoint.metadata
// Metadata (each key's TensorStorageMetadata or BytesStorageMetadata, and for each chunk or
// object a _StorageInfo: data file, byte offset, length); each chunk and object is a whole
// torch.save stream (a zip archive) at that place in a `__<rank>_<n>.distcp` file. The reader
// turns that into our Metadata: a tensor chunk points at the raw bytes of its storage record
// inside its stream (so load reads only the bytes it needs, as for our own format), an object
// at its whole stream (libtorch's unpickler reads it). There are no checksums.
#pragma once

#include "dtensor/checkpoint/planner.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace detail {

// Whether a `.metadata` file's bytes are a Python pickle (PyTorch's DCP) rather than our JSON.
bool is_dcp_metadata(const std::string& bytes);

// The Metadata of the PyTorch DCP checkpoint in `dir`, whose `.metadata` holds `bytes`. Reads the header of every tensor chunk's torch.save stream. Throws a c10::Error
// naming the key, file or global that is wrong; refuses a pickle naming any global outside
// DCP's metadata classes, torch.Size, dtypes, layouts and paths.
Metadata read_dcp_metadata(const std::string& dir, const std::string& bytes);

// Writing (SaveOptions::format = CheckpointFormat::kPyTorchDcp): where the storage bytes of a
// tensor start inside `stream`, the torch.save stream of one tensor that libtorch's pickle_save
// wrote (its record "data/0").
uint64_t tensor_bytes_offset(const std::vector<char>& stream);
// The `.metadata` pickle PyTorch's dcp.load reads, for `m`: its entries, each tensor chunk with
// the range of its torch.save stream (StoredChunk::stream_offset, stream_length).
std::string dcp_metadata_pickle(const Metadata& m);

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
