// dtensor/checkpoint/save_internal.cpp: save's fault points and directory lock (see
// save_internal.h).
#include "dtensor/checkpoint/save_internal.h"

#include "dtensor/utils/no_destructor_internal.h"


#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>

namespace dtensor {
namespace checkpoint {
namespace detail {

std::string errno_str() { return std::strerror(errno); }

NewFile::NewFile(const std::string& path, const std::string& what) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ >= 0) return;
  std::error_code ec;
  const std::string why = errno != EEXIST ? errno_str()
                          : std::filesystem::is_directory(std::filesystem::symlink_status(path, ec))
                              ? "a directory is in its way"
                              : "a file of that name appeared meanwhile";
  TORCH_CHECK(false, "cannot create ", what, "'", path, "': ", why);
}

NewFile::~NewFile() {
  if (fd_ >= 0) ::close(fd_);
}

void NewFile::close(bool sync) {
  if (sync) TORCH_CHECK(::fsync(fd_) == 0, "cannot sync '", path_, "': ", errno_str());
  const int fd = fd_;
  fd_ = -1;
  TORCH_CHECK(::close(fd) == 0, "cannot close '", path_, "': ", errno_str());
}

bool resolve_use_dist(bool no_dist, const comm::GroupPtr& group) {
  if (no_dist) return false;
  return group != nullptr || comm::is_initialized();
}

comm::GroupPtr resolve_group(bool use_dist, const comm::GroupPtr& group) {
  if (!use_dist) return nullptr;
  return group ? group : comm::default_group();
}

void write_all(int fd, const char* p, int64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, size_t(std::min<int64_t>(n, int64_t(1) << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      TORCH_CHECK(false, "cannot write '", path, "': ", errno_str());
    }
    p += w;
    n -= w;
  }
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  TORCH_CHECK(fd >= 0, "cannot open '", path, "' to sync it: ", errno_str());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  TORCH_CHECK(rc == 0, "cannot sync '", path, "': ", std::strerror(err));
}

void to_json(nlohmann::json& j, const WriteResult& r) {
  j = {{"item", r.item}, {"stored", r.stored}};
  if (r.stored.stream_offset >= 0) j["stream"] = {r.stored.stream_offset, r.stored.stream_length};
}
void from_json(const nlohmann::json& j, WriteResult& r) {
  j.at("item").get_to(r.item);
  j.at("stored").get_to(r.stored);
  if (j.contains("stream")) {
    r.stored.stream_offset = j.at("stream").at(0).get<int64_t>();
    r.stored.stream_length = j.at("stream").at(1).get<int64_t>();
  }
}

namespace {

std::mutex hook_mu;
std::shared_ptr<const SaveFaultHook>& hook_slot() {
  static dtensor::utils::NoDestructor<std::shared_ptr<const SaveFaultHook>> slot;
  return slot.get();
}

// Attempts at the lock when the file it locked was replaced in between (each replacement is a
// whole save of another job that started and ended meanwhile).
constexpr int kLockAttempts = 100;

std::string read_holder(int fd) {
  std::string text;
  char buf[512];
  for (off_t off = 0; text.size() < 4096;) {
    ssize_t r = ::pread(fd, buf, sizeof buf, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    text.append(buf, size_t(r));
    off += r;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

// "pid 1234 on host node7 (coordinator rank 0 of 4), job 5512, since 2025-01-31T12:00:00Z".
std::string identity(const std::string& who) {
  std::string s = "pid " + std::to_string(::getpid()) + " on host " + this_host();
  if (!who.empty()) s += " (" + who + ")";
  for (const char* var : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      s += std::string(", job ") + v;
      break;
    }
  }
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char when[32] = {};
  if (::gmtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return s + ", since " + when;
}

// flock's errors on a file system that has no flock (some network and parallel file systems).
bool flock_unsupported(int err) { return err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP || err == EINVAL; }

}  // namespace

bool lock_holder_is_gone(const std::string& holder) {
  long long pid = 0;
  char host[256] = {};
  if (std::sscanf(holder.c_str(), "pid %lld on host %255s", &pid, host) != 2 || pid <= 0) return false;
  std::string h = host;
  if (!h.empty() && h.back() == ',') h.pop_back();  // "on host node7, job ..."
  return h == this_host() && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

const char* to_string(SaveFaultPoint point) {
  switch (point) {
    case SaveFaultPoint::kBeforeData:
      return "before_data";
    case SaveFaultPoint::kMidData:
      return "mid_data";
    case SaveFaultPoint::kAfterData:
      return "after_data";
    case SaveFaultPoint::kBeforeRename:
      return "before_rename";
    case SaveFaultPoint::kAfterRename:
      return "after_rename";
  }
  return "?";
}

void set_save_fault_hook(SaveFaultHook hook) {
  std::lock_guard<std::mutex> lk(hook_mu);
  hook_slot() = hook ? std::make_shared<const SaveFaultHook>(std::move(hook)) : nullptr;
}

void save_fault_point(SaveFaultPoint point, int rank) {
  std::shared_ptr<const SaveFaultHook> hook;
  {
    std::lock_guard<std::mutex> lk(hook_mu);
    hook = hook_slot();
  }
  if (hook) (*hook)(point, rank);
}

// NOTE: [Crash consistency of save] in save_load.cpp says why the file is removed while the
// lock is held: a save that opened the file before the removal and locks it afterwards holds
// a lock on a file no longer in the directory; it sees that (the inode at the path differs, or
// there is none) and starts over with the file now there.
DirectoryLock::DirectoryLock(const std::string& dir, const std::string& who)
    : path_((std::filesystem::path(dir) / kFileName).string()) {
  for (int attempt = 1;; ++attempt) {
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TORCH_CHECK(fd >= 0, "cannot create the lock file '", path_, "' of checkpoint directory '", dir,
                "': ", std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = read_holder(fd);
      if (flock_unsupported(err)) {
        // No flock here: the file's content is the lock (best effort: two saves that start at
        // the same instant may both take it). A holder that is a dead process of this host
        // left it behind; a holder on another host is trusted to be alive.
        if (holder.empty() || lock_holder_is_gone(holder)) {
          fd_ = fd;
          break;
        }
        ::close(fd);
        TORCH_CHECK(false, "checkpoint directory '", dir, "' is being saved by another job: ", holder,
                    ". Saves into one directory must not overlap: wait for that save to end, or save into "
                    "another directory; if that job is gone, remove the lock file '", path_, "'");
      }
      ::close(fd);
      if (err == EINTR) continue;
      TORCH_CHECK(err != EWOULDBLOCK, "checkpoint directory '", dir, "' is being saved by another job: ",
                  holder.empty() ? std::string("(it has not written its identity yet)") : holder,
                  ". Saves into one directory must not overlap: wait for that save to end, or save into "
                  "another directory (lock file '", path_, "')");
      TORCH_CHECK(false, "cannot lock '", path_, "' (checkpoint directory '", dir, "'): ", std::strerror(err));
    }
    struct stat held {}, now {};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino) {
      fd_ = fd;
      break;
    }
    ::close(fd);
    TORCH_CHECK(attempt < kLockAttempts, "cannot lock '", path_, "': it was replaced ", attempt,
                " times while this save tried to lock it (other jobs save into '", dir, "')");
  }
  // Whoever held it before (a job that died) left its identity: replace it.
  const std::string me = identity(who) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const int err = errno;
    ::unlink(path_.c_str());
    ::close(fd_);
    TORCH_CHECK(false, "cannot write the lock file '", path_, "': ", std::strerror(err));
  }
}

DirectoryLock::~DirectoryLock() {
  ::unlink(path_.c_str());  // while still locked (see the constructor)
  ::close(fd_);
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
