// harness/internal/launch_io.h: what the launcher's parts share: newline-delimited JSON over
// sockets, the fork server's interface to rank sets, and the rank-set directories (NOTE:
// [Nothing left in TMPDIR]). Not installed.
#pragma once

#include "harness/internal/launcher.h"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <optional>
#include <string>

namespace dtensor {
namespace testing {
namespace internal {

// ---- sockets (launch_io.cpp) -------------------------------------------------------------------
// Writes all of `s` (NOTE: [No SIGPIPE from a peer that is gone]); false on an error.
bool write_all(int fd, const std::string& s);
bool write_line(int fd, const nlohmann::json& j);
void set_nonblocking(int fd);
// A connected AF_UNIX stream socket, or -1.
int connect_unix(const std::string& path);

// Newline-delimited messages over a socket.
struct LineReader {
  std::string buf;
  // Reads what is available: >0 bytes read, 0 EOF, -1 nothing now / error.
  ssize_t fill(int fd);
  bool next(std::string& line);
};

// ---- the fork server, seen from a rank set (fork_server.cpp) ------------------------------------
// Its socket (for poll), or -1 when it is not running.
int fork_server_fd();
// Launches a rank; its pid. Raises when the fork server cannot fork or does not answer.
pid_t fork_server_spawn(const RankRequest& req);
// Reads the exits the fork server reported so far (non-blocking).
void fork_server_pump();
// The wait status of rank process `pid` if the fork server reported its exit (taken: asked once).
std::optional<int> take_rank_exit(pid_t pid);
// A rank this program no longer waits for (NOTE: [Reported ranks are not waited for]): its exit
// report, come or to come, is dropped.
void forget_rank(pid_t pid);

// ---- rank-set directories (temp_dirs.cpp) -------------------------------------------------------
struct LiveDir;
// Registers the directory of a live rank set with `ranks` rank logs, for the stop-signal handler.
LiveDir* register_live_dir(const std::string& path, int ranks);
void unregister_live_dir(LiveDir* d);
// Removes the directories of orchestrators that no longer exist.
void remove_stale_dirs(const std::string& tmpdir);

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
