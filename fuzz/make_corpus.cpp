// fuzz/make_corpus.cpp: writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/)
// from a tiny checkpoint saved, exported and pickled by the library itself, plus a few
// invalid files. Run from build-fuzz/ (docs/fuzzing.md):
//
//   build-fuzz/fuzz/make_fuzz_corpus fuzz/corpus
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/export.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace ckpt = dtensor::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) {
    std::cerr << "make_fuzz_corpus: cannot write " << (dir / name) << "\n";
    std::exit(1);
  }
}

std::string bytes_of(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }

// checkpoint_load_fuzzer's input: flags, the metadata's length, the metadata, the data file.
std::string checkpoint_input(bool verify, const std::string& metadata, const std::string& data) {
  std::string out;
  out += char(verify ? 1 : 0);
  out += char(metadata.size() & 0xff);
  out += char(metadata.size() >> 8);
  return out + metadata + data;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_corpus <corpus directory, e.g. fuzz/corpus>\n";
    return 2;
  }
  const fs::path root = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("dtensor-fuzz-corpus-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  // 1. A tiny checkpoint: tensors of several dtypes (one of two checksum blocks) and values.
  c10::impl::GenericDict cfg(c10::StringType::get(), c10::AnyType::get());
  cfg.insert("layers", int64_t(2));
  cfg.insert("act", std::string("gelu"));
  ckpt::StateDict sd{{"w", at::arange(32, at::kFloat).reshape({4, 8})},
                     {"b", at::arange(3, at::kLong)},
                     {"h", at::ones({2, 2}, at::kBFloat16)},
                     {"mask", at::arange(3, at::kLong).remainder(2).to(at::kBool)},
                     {"step", c10::IValue(int64_t(7))},
                     {"name", c10::IValue(std::string("run-1"))},
                     {"betas", c10::IValue(std::vector<double>{0.9, 0.999})},
                     {"cfg", c10::IValue(cfg)}};
  ckpt::SaveOptions so;
  so.no_dist = true;
  so.sync_files = false;
  so.checksum_block_bytes = 64;
  const fs::path dir = tmp / "ckpt";
  const ckpt::Metadata saved = ckpt::save(sd, dir.string(), so);
  const std::vector<std::string> files = saved.files();
  if (files.size() != 1) {
    std::cerr << "make_fuzz_corpus: expected one data file\n";
    return 1;
  }
  // The fuzz targets name the data file __0_0.distcp (whatever save id the save took).
  nlohmann::json j = nlohmann::json::parse(read_file(dir / ".metadata"));
  for (auto& [key, entry] : j["entries"].items()) {
    for (auto& chunk : entry["chunks"]) chunk["file"] = "__0_0.distcp";
  }
  const std::string metadata = j.dump();
  const std::string data = read_file(dir / files[0]);
  fs::rename(dir / files[0], dir / "__0_0.distcp");
  write(dir, ".metadata", metadata);

  // 2. metadata: as save writes it, pretty-printed, with a key the SAX reader leaves to
  // nlohmann::json; invalid: another version, cut short, overlapping chunks, a huge size.
  const fs::path md = root / "metadata";
  write(md, "saved.json", metadata);
  write(md, "pretty.json", j.dump(2));
  nlohmann::json utf8 = j;
  utf8["entries"]["\xc3\xa9t\xc3\xa9"] = j["entries"]["b"];
  write(md, "utf8_key.json", utf8.dump());
  nlohmann::json v2 = j;
  v2["version"] = 2;
  write(md, "bad_version.json", v2.dump());
  write(md, "bad_truncated.json", metadata.substr(0, metadata.size() / 2));
  nlohmann::json overlap = j;
  overlap["entries"]["w"]["chunks"].push_back(overlap["entries"]["w"]["chunks"][0]);
  write(md, "bad_overlap.json", overlap.dump());
  nlohmann::json huge = j;
  huge["entries"]["b"]["size"] = {int64_t(1) << 60};
  write(md, "bad_huge_size.json", huge.dump());

  // 3. checkpoint_load: the checkpoint, checked and not; its data file cut short.
  const fs::path cl = root / "checkpoint_load";
  write(cl, "saved_verified", checkpoint_input(true, metadata, data));
  write(cl, "saved_unverified", checkpoint_input(false, metadata, data));
  write(cl, "bad_truncated_data", checkpoint_input(true, metadata, data.substr(0, data.size() / 2)));

  // 4. torch_save: values as the checkpoint stores them, and a whole export_torch_save file.
  const fs::path ts = root / "torch_save";
  for (const auto& key : {"step", "name", "betas", "cfg"}) {
    write(ts, std::string(key) + ".pt", bytes_of(torch::jit::pickle_save(std::get<c10::IValue>(sd.at(key)))));
  }
  write(ts, "tensor.pt", bytes_of(torch::jit::pickle_save(at::arange(4, at::kFloat))));
  ckpt::export_torch_save(dir.string(), (tmp / "model.pt").string());
  write(ts, "export.pt", read_file(tmp / "model.pt"));

  // 5. safetensors: the export; invalid: a header length past the file, the file cut short.
  const fs::path st = root / "safetensors";
  ckpt::export_safetensors(dir.string(), (tmp / "model.safetensors").string());
  const std::string model = read_file(tmp / "model.safetensors");
  write(st, "export.safetensors", model);
  write(st, "bad_header_length.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10));
  write(st, "bad_truncated.safetensors", model.substr(0, model.size() - 8));

  // 6. safetensors_index (the target's own two files: "a" and "b"): valid, a key in the wrong
  // file, a file outside the directory.
  const fs::path si = root / "safetensors_index";
  auto index = [](const std::string& a, const std::string& b) {
    return nlohmann::json{{"metadata", {{"total_size", 16}}}, {"weight_map", {{"a", a}, {"b", b}}}}.dump(2) + "\n";
  };
  write(si, "index.json", index("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  write(si, "bad_wrong_file.json", index("model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  write(si, "bad_outside.json", index("../model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));

  fs::remove_all(tmp);
  std::cout << "make_fuzz_corpus: wrote " << root << "\n";
  return 0;
}
