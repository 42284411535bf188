// tools/opcov/discovery.h: strategy discovery's findings (tools/strategy_discovery --json) and
// PyTorch's DTensor on the same samples (tools/opcov/pytorch_strategies.py --out) in the
// op-coverage report.
//
// NOTE: [Discovery in the op-coverage report]
// The report's "Strategy discovery" section gives discovery's figures (input combinations run,
// valid strategies found, the rules' wrong strategies, the missing ones ranked by the bytes of
// redistribution they would save). With PyTorch's side, every (sample, input combination) both
// sides ran falls in one category:
//   both right      each side runs it and gives the right values
//   only ours       PyTorch raises (no strategy), ours runs it right
//   only PyTorch    ours raises, PyTorch runs it right
//   PyTorch wrong   PyTorch runs it and its values differ from the single-device op's
//   we are wrong    our rule chooses a strategy discovery finds not valid
//   neither         both raise
// and, where both are right, which side redistributes its inputs when the other does not
// ("ours cheaper" / "PyTorch cheaper"). Our side is what our rule chooses for the combination
// (propagate()'s choice, judged against discovery: the values it would give); a rule that runs
// its own kernel is "unjudged" there and counts as right, its values being the op suite's to
// check. PyTorch's side ran the op on its DTensors and compared full_tensor() with the plain op.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace dtensor {
namespace opcov {

// Reads strategy_discovery's --json file; throws (naming the file and what is wrong) when it
// is not one.
nlohmann::json load_discovery(const std::string& path);

// Reads pytorch_strategies.py's --out file (JSON lines: a header, then one line per
// combination); throws when it is not one. The header's "unavailable" says why PyTorch's side
// did not run (an old torch): the result then holds the header only.
struct PytorchStrategies {
  nlohmann::json header;
  std::vector<nlohmann::json> lines;
};
PytorchStrategies load_pytorch_strategies(const std::string& path);

extern const char* const kStrategyCategories[];  // "both right", ..., "neither"
extern const size_t kStrategyCategoryCount;

struct StrategyComparison {
  std::map<std::string, int> totals;  // category (and "ours cheaper", "PyTorch cheaper") -> count
  int compared = 0;                   // combinations both sides ran
  int ours_only_ran = 0, pytorch_only_ran = 0;  // combinations only one side has a record of
  struct Op {
    std::map<std::string, int> counts;
    // Combinations where the sides differ (category, or cheaper side): a line each, up to 20.
    std::vector<std::string> differences;
  };
  std::map<std::string, Op> ops;  // "aten::mm" -> ...
  // PyTorch's wrong results: op, inputs, outputs, max_error, reproducer.
  std::vector<nlohmann::json> pytorch_wrong;
};

// The category of one combination (NOTE: [Discovery in the op-coverage report]); "" when a
// side did not judge it (PyTorch's "error" or "skipped").
std::string strategy_category(const std::string& ours, const std::string& pytorch);

StrategyComparison compare_strategies(const nlohmann::json& discovery, const PytorchStrategies& pytorch);

// The report's pieces.
nlohmann::json discovery_json(const nlohmann::json& discovery, const PytorchStrategies& pytorch);
std::string discovery_markdown(const nlohmann::json& discovery, const PytorchStrategies& pytorch);
std::string discovery_html(const nlohmann::json& discovery, const PytorchStrategies& pytorch);

}  // namespace opcov
}  // namespace dtensor
