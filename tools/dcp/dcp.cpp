// tools/dcp: look at and convert dtensor-cpp distributed checkpoints (one process, no group).
//
//   dcp list <checkpoint_dir>                         keys, dtypes, global shapes, chunks, bytes, files
//   dcp convert <checkpoint_dir> --to torch <file.pt>          a file Python's torch.load reads
//   dcp convert <checkpoint_dir> --to safetensors <file.safetensors> [--max-shard-bytes N]
//                                   (split: <stem>-0000i-of-0000N.safetensors + <file>.index.json)
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

namespace {

int usage() {
  std::cerr << "usage: dcp list <checkpoint_dir>\n"
               "       dcp convert <checkpoint_dir> --to torch|safetensors <out_file> [--max-shard-bytes N]\n";
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
    if ((argc == 6 || argc == 8) && std::string(argv[1]) == "convert" && std::string(argv[3]) == "--to") {
      const std::string to = argv[4];
      dtensor::checkpoint::SafetensorsExportOptions opts;
      if (argc == 8) {
        if (to != "safetensors" || std::string(argv[6]) != "--max-shard-bytes") return usage();
        char* end = nullptr;
        opts.max_shard_bytes = std::strtoll(argv[7], &end, 10);
        if (!end || *end || opts.max_shard_bytes <= 0) {
          std::cerr << "dcp: --max-shard-bytes wants a positive number of bytes, got '" << argv[7] << "'\n";
          return 2;
        }
      }
      std::vector<std::string> written;
      if (to == "torch") {
        dtensor::checkpoint::export_torch_save(argv[2], argv[5]);
        written.push_back(argv[5]);
      } else if (to == "safetensors") {
        written = dtensor::checkpoint::export_safetensors(argv[2], argv[5], opts);
      } else {
        return usage();
      }
      for (const auto& f : written) std::printf("wrote %s\n", f.c_str());
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
