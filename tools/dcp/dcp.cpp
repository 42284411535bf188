// tools/dcp: look at, verify and convert distributed checkpoints: ours, PyTorch's DCP and
// Hugging Face safetensors directories (one process, no group).
//
//   dcp list <checkpoint_dir>                         format, keys, dtypes, global shapes, chunks, bytes, files
//   dcp verify <checkpoint_dir>                       reads every value (checksums where the format has them)
//   dcp convert <checkpoint_dir> --to dtensor-cpp|pytorch-dcp|huggingface <out_dir>   another checkpoint format
//                                   (huggingface: sharded/ and the consolidated files with their index)
//   dcp consolidate <sharded_dir> <out_dir> [--files N]   full tensors of a sharded Hugging Face save
//                                   (N: files to spread the keys over, in key order; default 1)
//   dcp convert <checkpoint_dir> --to torch <file.pt>          a file Python's torch.load reads
//   dcp convert <checkpoint_dir> --to safetensors <file.safetensors> [--max-shard-bytes N]
//                                   (split: <stem>-0000i-of-0000N.safetensors + <file>.index.json)
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

namespace {

int usage() {
  std::cerr << "usage: dcp list <checkpoint_dir>\n"
               "       dcp verify <checkpoint_dir>\n"
               "       dcp convert <checkpoint_dir> --to dtensor-cpp|pytorch-dcp|huggingface <out_dir>\n"
               "       dcp convert <checkpoint_dir> --to torch|safetensors <out_file> [--max-shard-bytes N]\n"
               "       dcp consolidate <sharded_dir> <out_dir> [--files N]\n";
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
  if (m.checksummed) {
    std::printf("checkpoint %s: dtensor-cpp format version %d, save %lld, written by %d ranks, %lld bytes\n",
                dir.c_str(), m.version, (long long)m.save_id, m.world_size, (long long)m.total_bytes());
  } else if (!std::filesystem::exists(std::filesystem::path(dir) / ".metadata")) {
    std::printf("checkpoint %s: Hugging Face safetensors, %lld bytes of tensors\n", dir.c_str(), (long long)m.total_bytes());
  } else {
    std::printf("checkpoint %s: PyTorch DCP format, %lld bytes of values\n", dir.c_str(), (long long)m.total_bytes());
  }
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

// Reads every value into memory (a checksum mismatch, a truncated file or a bad value is an
// error naming the key and file).
int verify(const std::string& dir) {
  const auto sd = dtensor::checkpoint::load_full(dir);
  std::printf("verified %s: %zu keys read\n", dir.c_str(), sd.size());
  return 0;
}

// The checkpoint in the other format, through memory (one process).
int convert_format(const std::string& dir, const std::string& to, const std::string& out) {
  namespace dcp = dtensor::checkpoint;
  const dcp::StateDict sd = dcp::load_full(dir);
  dcp::SaveOptions o;
  o.no_dist = true;
  o.format = to == "pytorch-dcp"   ? dcp::CheckpointFormat::kPyTorchDcp
             : to == "huggingface" ? dcp::CheckpointFormat::kHuggingFace
                                   : dcp::CheckpointFormat::kDtensorCpp;
  o.enable_consolidation = true;
  const dcp::Metadata m = dcp::save(sd, out, o);
  std::printf("wrote %s (%s format): %zu keys, %lld bytes of values\n", out.c_str(), to.c_str(), m.entries.size(),
              (long long)m.total_bytes());
  return 0;
}

// The shards' keys spread over `files` consolidated files, in key order.
int consolidate(const std::string& in, const std::string& out, int files) {
  namespace dcp = dtensor::checkpoint;
  const dcp::Metadata m = dcp::read_metadata(in);
  std::map<std::string, int> mapping;
  const size_t per_file = (m.entries.size() + size_t(files) - 1) / size_t(files);
  size_t i = 0;
  for (const auto& [k, e] : m.entries) mapping[k] = 1 + int(i++ / std::max<size_t>(per_file, 1));
  dcp::SaveOptions o;
  o.no_dist = true;
  for (const auto& f : dcp::consolidate_safetensors_files(in, out, mapping, o)) std::printf("wrote %s\n", f.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "list") return list(argv[2]);
    if (argc == 3 && std::string(argv[1]) == "verify") return verify(argv[2]);
    if (argc == 6 && std::string(argv[1]) == "convert" && std::string(argv[3]) == "--to" &&
        (std::string(argv[4]) == "dtensor-cpp" || std::string(argv[4]) == "pytorch-dcp" ||
         std::string(argv[4]) == "huggingface")) {
      return convert_format(argv[2], argv[4], argv[5]);
    }
    if ((argc == 4 || argc == 6) && std::string(argv[1]) == "consolidate") {
      int files = 1;
      if (argc == 6) {
        char* end = nullptr;
        const long n = std::strtol(argv[5], &end, 10);
        if (std::string(argv[4]) != "--files" || !end || *end || n < 1 || n > 99999) {
          std::cerr << "dcp: consolidate takes --files N with N from 1 to 99999, got '" << argv[4] << " " << argv[5]
                    << "'\n";
          return 2;
        }
        files = int(n);
      }
      return consolidate(argv[2], argv[3], files);
    }
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
