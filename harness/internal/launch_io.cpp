// harness/internal/launch_io.cpp: the rank protocol's messages and sockets (NOTE: [Rank
// process protocol] in launcher.h).
#include "harness/internal/launch_io.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

using nlohmann::json;

namespace dtensor {
namespace testing {
namespace internal {

void to_json(json& j, const RankRequest& r) {
  j = {{"test_id", r.test_id},       {"rank", r.rank},       {"world_size", r.world_size},
       {"ctl_path", r.ctl_path},     {"log_path", r.log_path}, {"store_port", r.store_port},
       {"backend", r.backend},       {"timeout_ms", r.timeout_ms}};
}
void from_json(const json& j, RankRequest& r) {
  r.test_id = j.at("test_id").get<std::string>();
  r.rank = j.at("rank").get<int>();
  r.world_size = j.at("world_size").get<int>();
  r.ctl_path = j.at("ctl_path").get<std::string>();
  r.log_path = j.at("log_path").get<std::string>();
  r.store_port = j.at("store_port").get<int>();
  r.backend = j.at("backend").get<std::string>();
  r.timeout_ms = j.at("timeout_ms").get<int64_t>();
}

// NOTE: [No SIGPIPE from a peer that is gone]
// A rank can exit between the orchestrator's last read and its next write (the "exit" line
// of ~RankSet, a pool's next "run"): a plain write() to that socket raises SIGPIPE, which
// kills the test program without a word. Sockets are written with MSG_NOSIGNAL (EPIPE is then
// an ordinary error), and main_with_harness ignores SIGPIPE for the pipes.
bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  bool socket = true;
  while (off < s.size()) {
    ssize_t w = socket ? ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL) : -1;
    if (w < 0 && socket && errno == ENOTSOCK) {
      socket = false;
      continue;
    }
    if (!socket) w = ::write(fd, s.data() + off, s.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(w);
  }
  return true;
}
bool write_line(int fd, const json& j) { return write_all(fd, j.dump() + "\n"); }

ssize_t LineReader::fill(int fd) {
  char tmp[65536];
  ssize_t r = ::read(fd, tmp, sizeof tmp);
  if (r > 0) buf.append(tmp, static_cast<size_t>(r));
  if (r < 0 && errno != EAGAIN && errno != EINTR) return 0;
  return r;
}

bool LineReader::next(std::string& line) {
  auto nl = buf.find('\n');
  if (nl == std::string::npos) return false;
  line = buf.substr(0, nl);
  buf.erase(0, nl + 1);
  return true;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  return fd;
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
