// tools/dcp: look at and convert dtensor-cpp distributed checkpoints (one process, no group).
//
//   dcp list <checkpoint_dir>                         keys, dtypes, global shapes, chunks, bytes, files
//   dcp convert <checkpoint_dir> --to torch <file.pt>          a file Python's torch.load reads
//   dcp convert <checkpoint_dir> --to safetensors <file.safetensors>
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

namespace {

int usage() {
  std::cerr << "usage: dcp list <checkpoint_dir>\n"
               "       dcp convert <checkpoint_dir> --to torch|safetensors <out_file>\n";
  return 2;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

int list(const std::string& dir) {
  namespace dcp = dtensor::checkpoint;
  dcp::Metadata m = dcp::read_metadata(dir);
  std::printf("checkpoint %s: format version %d, save %lld, written by %d ranks, %lld bytes\n", dir.c_str(),
              m.version, (long long)m.save_id, m.world_size, (long long)m.total_bytes());
  std::printf("%-40s %-8s %-10s %-18s %7s %12s\n", "key", "kind", "dtype", "shape", "chunks", "bytes");
  for (const auto& [k, e] : m.entries) {
    int64_t bytes = 0;
    for (const auto& c : e.chunks) bytes += c.length;
    std::printf("%-40s %-8s %-10s %-18s %7zu %12lld\n", k.c_str(), e.kind == dcp::ItemKind::Tensor ? "tensor" : "object",
                e.kind == dcp::ItemKind::Tensor ? e.dtype.c_str() : "-",
                e.kind == dcp::ItemKind::Tensor ? shape_str(e.size).c_str() : "-", e.chunks.size(), (long long)bytes);
  }
  std::printf("files:\n");
  for (const auto& f : m.files()) {
    std::error_code ec;
    auto size = std::filesystem::file_size(std::filesystem::path(dir) / f, ec);
    std::printf("  %s %s\n", f.c_str(), ec ? "(missing)" : (std::to_string(size) + " bytes").c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "list") return list(argv[2]);
    if (argc == 6 && std::string(argv[1]) == "convert" && std::string(argv[3]) == "--to") {
      const std::string to = argv[4];
      if (to == "torch") {
        dtensor::checkpoint::export_torch_save(argv[2], argv[5]);
      } else if (to == "safetensors") {
        dtensor::checkpoint::export_safetensors(argv[2], argv[5]);
      } else {
        return usage();
      }
      std::printf("wrote %s\n", argv[5]);
      return 0;
    }
    return usage();
  } catch (const c10::Error& e) {
    std::cerr << "dcp: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dcp: " << e.what() << "\n";
    return 1;
  }
}
