// dtensor/comm/trace.cpp: NOTE: [Harness trace] in trace.h.
#include "dtensor/comm/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace dtensor {
namespace comm {
namespace {
int open_trace() {
  const char* path = std::getenv("DTENSOR_HARNESS_TRACE");
  if (!path || !*path) return -1;
  return ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}
// Opened once per program; forked ranks inherit the descriptor, spawned ones reopen it.
int trace_fd() {
  static const int fd = open_trace();
  return fd;
}
}  // namespace

bool tracing() { return trace_fd() >= 0; }

void trace_event(const char* what, int rank) {
  const int fd = trace_fd();
  if (fd < 0) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  char line[256];
  const int len = std::snprintf(line, sizeof line, "%lld %d %d %s\n", static_cast<long long>(ns),
                                static_cast<int>(::getpid()), rank, what);
  if (len > 0) (void)!::write(fd, line, static_cast<size_t>(len < static_cast<int>(sizeof line) ? len : sizeof line - 1));
}

}  // namespace comm
}  // namespace dtensor
