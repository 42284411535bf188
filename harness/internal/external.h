// harness/internal/external.h: external launcher mode (DESIGN.md D3). Under torchrun, mpirun or
// srun every process is one rank: nothing is spawned, each process runs the same tests in the
// same order on one process group, results are exchanged after each test, and only rank 0
// prints and writes reports.
#pragma once

#include <chrono>
#include <string>

namespace dtensor {
namespace testing {
namespace internal {

// True when launcher variables are in the environment (checked once, at program start).
bool external_launcher_detected();
bool external_launcher_active();
// Collective over the job: creates the default group. Rank != 0 stops printing results.
void init_external_launcher();
void run_external(const std::string& test_id, std::chrono::milliseconds timeout);
void shutdown_external();

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
