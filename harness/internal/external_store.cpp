// harness/internal/external_store.cpp
#include "harness/internal/external_store.h"

#include "dtensor/compat.h"
#include "harness/internal/timing.h"

#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dtensor {
namespace testing {
namespace internal {

std::string err_text(const std::exception& e) {
  auto* ce = dynamic_cast<const c10::Error*>(&e);
  return ce ? ce->what_without_backtrace() : e.what();
}
std::string short_text(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n) + "...";
  return s;
}
std::string bytes_str(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
std::vector<uint8_t> str_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  compat::disable_libuv(o);
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

c10::intrusive_ptr<c10d::TCPStore> host_store(const std::string& host, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = timeout;
  compat::disable_libuv(o);
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

c10::intrusive_ptr<c10d::TCPStore> connect_watchdog_store(const std::string& host, int port) {
  auto s = connect_store(host, port, kStoreLostAfter);
  s->add(kExternalPrefix + "watchdogs", 1);
  s->wait({kExternalPrefix + "watchdogs"}, kStoreLostAfter);  // sets the socket's receive timeout
  return s;
}

std::string interface_address(const std::string& name) {
  TORCH_CHECK(name.find(',') == std::string::npos, "GLOO_SOCKET_IFNAME='", name,
              "': the harness binds Gloo to one interface; name one");
  ifaddrs* all = nullptr;
  TORCH_CHECK(::getifaddrs(&all) == 0, "GLOO_SOCKET_IFNAME='", name, "': getifaddrs failed: ", std::strerror(errno));
  std::string found, names;
  for (ifaddrs* a = all; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (names.find(std::string(" ") + a->ifa_name + ",") == std::string::npos)
      names += std::string(" ") + a->ifa_name + ",";
    if (found.empty() && name == a->ifa_name) {
      char buf[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
    }
  }
  ::freeifaddrs(all);
  if (!names.empty()) names.pop_back();
  TORCH_CHECK(!found.empty(), "GLOO_SOCKET_IFNAME='", name, "': this host has no IPv4 interface of that name (it has:",
              names, ")");
  return found;
}

std::string source_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) out = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
