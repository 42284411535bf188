// dtensor/parallel/style.h
//
// Parallel styles: how one module is tensor-parallelized (the counterparts of
// torch.distributed.tensor.parallel.style). A style distributes the module's parameters and
// installs forward hooks that bring its inputs to the layout it computes in and its output to
// the layout the caller wants. Styles are applied by parallelize_module (api.h); options use
// libtorch's chained-setter form:
//
//   dtensor::ColwiseParallel()                                   // Linear/Embedding, column-sharded
//   dtensor::RowwiseParallel().output_layouts(dtensor::Shard{1})  // row-sharded, reduce-scatter out
//   dtensor::SequenceParallel()                                   // norms on sequence shards
//   dtensor::PrepareModuleInput().input_layouts({dtensor::Shard{1}})
//                                .desired_input_layouts({dtensor::Replicate{}})
//
// Layouts are single placements (tensor parallelism uses a 1-D mesh). A module's hooks run
// only when its parent calls it through dtensor::nn::call (dtensor/nn/hooks.h).
//
// Collective: apply() (parameters are distributed from the mesh's first rank) and every
// forward/backward of a hooked module (redistributions), on every rank of the mesh.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace dtensor {

// One layout per positional input (or output); nullopt leaves that position as it is.
using Layouts = std::vector<std::optional<Placement>>;

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Throws (naming `path`, the module's dotted path, "" for the root) when the style cannot be
  // applied to `module`. Local: parallelize_module checks a whole plan before applying any of it.
  virtual void check(torch::nn::Module& module, const std::string& path) const = 0;
  // Collective. Distributes the parameters and registers the hooks. `mesh` is 1-D.
  virtual void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const = 0;
  // True for styles that replace parameters (at most one of those per module).
  virtual bool distributes_parameters() const = 0;
  // PyTorch's repr: "ColwiseParallel(input_layouts=Replicate(), ...)".
  virtual std::string to_string() const = 0;
};

namespace detail {
// The src_data_rank of the parallelize_module call in progress on this thread (PyTorch sets
// ParallelStyle.src_data_rank): styles distribute parameters from it. Default 0.
class SrcDataRankGuard {
 public:
  explicit SrcDataRankGuard(std::optional<int64_t> src_data_rank);
  ~SrcDataRankGuard();
  SrcDataRankGuard(const SrcDataRankGuard&) = delete;
  SrcDataRankGuard& operator=(const SrcDataRankGuard&) = delete;
  static std::optional<int64_t> current();

 private:
  std::optional<int64_t> prev_;
};

// The options Colwise and Rowwise share (input_layouts, output_layouts, use_local_output),
// with setters that return the concrete style so that they chain.
template <class Style>
class LinearStyle : public ParallelStyle {
 public:
  Style& input_layouts(Placement p) {
    input_layouts_ = p;
    return static_cast<Style&>(*this);
  }
  Style& output_layouts(Placement p) {
    output_layouts_ = p;
    return static_cast<Style&>(*this);
  }
  Style& use_local_output(bool v) {
    use_local_output_ = v;
    return static_cast<Style&>(*this);
  }
  // Fuses the collective on the sequence dim with the Linear's matmul, pipelined (PyTorch's
  // async tensor parallel, NOTE: [Pipelined collective matmul] in fused_matmul.h): Colwise
  // all-gathers a Shard(d) input block by block while it multiplies the blocks that arrived;
  // Rowwise reduce-scatters its output to Shard(d) block by block while it multiplies the next.
  // Needs a Linear and, for Colwise, input_layouts Shard(d), for Rowwise, output_layouts
  // Shard(d), with d not the last (feature) dim and the sequence divisible by the mesh size.
  // Results equal the unfused ones up to the order of floating-point sums. Default false.
  Style& async_tp(bool v) {
    async_tp_ = v;
    return static_cast<Style&>(*this);
  }
  const Placement& input_layouts() const { return input_layouts_; }
  const Placement& output_layouts() const { return output_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  bool async_tp() const { return async_tp_; }

  void check(torch::nn::Module& module, const std::string& path) const override;
  bool distributes_parameters() const override { return true; }
  std::string to_string() const override;

 protected:
  LinearStyle(const char* name, Placement input, Placement output)
      : name_(name), input_layouts_(input), output_layouts_(output) {}

  const char* name_;
  Placement input_layouts_;
  Placement output_layouts_;
  bool use_local_output_ = true;
  bool async_tp_ = false;
};
}  // namespace detail

// Shards a Linear's weight (and bias) on the output features (Shard(0)), or an Embedding's
// weight on the embedding dim (Shard(1)). The input is taken as `input_layouts` (default
// Replicate(); a plain tensor is wrapped with from_local) and brought to Replicate; the output,
// sharded on its last dim, is brought to `output_layouts` (default Shard(-1)) and returned as
// a local tensor when use_local_output (default true). With async_tp, a Shard(d) input is
// gathered inside the matmul instead (fused_all_gather_matmul).
class ColwiseParallel : public detail::LinearStyle<ColwiseParallel> {
 public:
  ColwiseParallel() : LinearStyle("ColwiseParallel", Replicate{}, Shard{-1}) {}
  void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const override;
};

// Shards a Linear's weight on the input features (Shard(1); the bias is replicated) or an
// Embedding's weight on the vocabulary (Shard(0)). The input is taken as `input_layouts`
// (default Shard(-1)) and brought to Shard(-1) (Linear) or Replicate (Embedding); the output,
// a Partial sum, is reduced to `output_layouts` (default Replicate(): all_reduce; a Shard:
// reduce_scatter), local when use_local_output (default true). With async_tp, the
// reduce-scatter to a Shard(d) output runs inside the matmul (fused_matmul_reduce_scatter).
class RowwiseParallel : public detail::LinearStyle<RowwiseParallel> {
 public:
  RowwiseParallel() : LinearStyle("RowwiseParallel", Shard{-1}, Replicate{}) {}
  void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const override;
};

// Replicates the parameters of a module that computes independently per position of the
// sequence (LayerNorm, RMSNorm, Dropout, ...) and runs it on sequence shards: the input is
// taken as Shard(sequence_dim) (a plain tensor is this rank's shard; a DTensor is
// redistributed to it), and the output stays sharded. Every parameter of the module (and its
// descendants) must be swappable (NOTE: [Parameter swap]). The gradients of the replicated
// parameters come out Partial (sums over the shards), as in PyTorch; optimizers reduce them
// when they read them.
class SequenceParallel : public ParallelStyle {
 public:
  SequenceParallel& sequence_dim(int64_t d);  // default 1
  SequenceParallel& use_local_output(bool v);  // default false
  int64_t sequence_dim() const { return sequence_dim_; }
  bool use_local_output() const { return use_local_output_; }

  void check(torch::nn::Module& module, const std::string& path) const override;
  void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const override;
  bool distributes_parameters() const override { return true; }
  std::string to_string() const override;

 private:
  int64_t sequence_dim_ = 1;
  bool use_local_output_ = false;
};

// Layouts of named inputs (PyTorch's input_kwarg_layouts): the key of a forward argument that
// is a c10::Dict<std::string, at::Tensor> (the C++ spelling of keyword arguments).
using KwargLayouts = std::map<std::string, Placement>;

// Converts a module's positional inputs: input i is taken as input_layouts[i] (a plain tensor
// is wrapped with from_local; a DTensor is kept) and redistributed to desired_input_layouts[i];
// nullopt entries are left alone. Named inputs: a forward argument that is a
// c10::Dict<std::string, at::Tensor> carries keyword arguments; its entry `key` is taken as
// input_kwarg_layouts[key] and redistributed to desired_input_kwarg_layouts[key] (a key
// missing there is only wrapped). With kwarg layouts alone, input_layouts may be empty. The
// module's parameters are untouched.
//
//   struct Attn : torch::nn::Module {
//     at::Tensor forward(at::Tensor x, c10::Dict<std::string, at::Tensor> kwargs);
//   };
//   PrepareModuleInput().input_kwarg_layouts({{"mask", Shard{0}}})
//                       .desired_input_kwarg_layouts({{"mask", Replicate{}}});
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput& input_layouts(Layouts l);
  PrepareModuleInput& desired_input_layouts(Layouts l);
  PrepareModuleInput& input_kwarg_layouts(KwargLayouts l);
  PrepareModuleInput& desired_input_kwarg_layouts(KwargLayouts l);
  PrepareModuleInput& use_local_output(bool v);  // default false
  const Layouts& input_layouts() const { return input_layouts_; }
  const Layouts& desired_input_layouts() const { return desired_input_layouts_; }
  const KwargLayouts& input_kwarg_layouts() const { return input_kwarg_layouts_; }
  const KwargLayouts& desired_input_kwarg_layouts() const { return desired_input_kwarg_layouts_; }
  bool use_local_output() const { return use_local_output_; }

  void check(torch::nn::Module& module, const std::string& path) const override;
  void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const override;
  bool distributes_parameters() const override { return false; }
  std::string to_string() const override;

 private:
  Layouts input_layouts_;
  Layouts desired_input_layouts_;
  KwargLayouts input_kwarg_layouts_;
  KwargLayouts desired_input_kwarg_layouts_;
  bool use_local_output_ = false;
};

// Converts a module's output (a tensor, or each element of a tuple) the same way.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput& output_layouts(Layouts l);
  PrepareModuleOutput& desired_output_layouts(Layouts l);
  PrepareModuleOutput& use_local_output(bool v);  // default true
  const Layouts& output_layouts() const { return output_layouts_; }
  const Layouts& desired_output_layouts() const { return desired_output_layouts_; }
  bool use_local_output() const { return use_local_output_; }

  void check(torch::nn::Module& module, const std::string& path) const override;
  void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const override;
  bool distributes_parameters() const override { return false; }
  std::string to_string() const override;

 private:
  Layouts output_layouts_;
  Layouts desired_output_layouts_;
  bool use_local_output_ = true;
};

// PrepareModuleInput and PrepareModuleOutput in one style (PyTorch's
// PrepareModuleInputOutput): the inputs as PrepareModuleInput converts them (use_local_input,
// default false), the outputs as PrepareModuleOutput (use_local_output, default true).
class PrepareModuleInputOutput : public ParallelStyle {
 public:
  PrepareModuleInputOutput& input_layouts(Layouts l);
  PrepareModuleInputOutput& desired_input_layouts(Layouts l);
  PrepareModuleInputOutput& input_kwarg_layouts(KwargLayouts l);
  PrepareModuleInputOutput& desired_input_kwarg_layouts(KwargLayouts l);
  PrepareModuleInputOutput& use_local_input(bool v);  // default false
  PrepareModuleInputOutput& output_layouts(Layouts l);
  PrepareModuleInputOutput& desired_output_layouts(Layouts l);
  PrepareModuleInputOutput& use_local_output(bool v);  // default true
  const PrepareModuleInput& input() const { return input_; }
  const PrepareModuleOutput& output() const { return output_; }

  void check(torch::nn::Module& module, const std::string& path) const override;
  void apply(torch::nn::Module& module, const DeviceMesh& mesh, const std::string& path) const override;
  bool distributes_parameters() const override { return false; }
  std::string to_string() const override;

 private:
  PrepareModuleInput input_;
  PrepareModuleOutput output_;
};

}  // namespace dtensor
