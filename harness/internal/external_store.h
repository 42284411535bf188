// harness/internal/external_store.h: the job's TCPStore as the external-launcher mode uses it
// (NOTE: [External ranks learn of failures through the store] in external.cpp): its keys, the
// connections to it, and the addresses other hosts reach this one at.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {
namespace internal {

// Every key the harness sets in the job's store starts with this.
inline const std::string kExternalPrefix = "dtensor_ext/";

// An exception's message without libtorch's backtrace.
std::string err_text(const std::exception& e);
// `s`, cut to `n` characters.
std::string short_text(std::string s, size_t n = 300);
std::string bytes_str(const std::vector<uint8_t>& b);
std::vector<uint8_t> str_bytes(const std::string& s);

// A client connection to the store at host:port.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, int port, std::chrono::milliseconds timeout);
// A store server on `host` at a port the system picks (its getPort()).
c10::intrusive_ptr<c10d::TCPStore> host_store(const std::string& host, std::chrono::milliseconds timeout);
// A connection for the watchdog: every request on it fails after kStoreLostAfter without an
// answer (NOTE: [A peer lost without a word] in watchdog.cpp).
c10::intrusive_ptr<c10d::TCPStore> connect_watchdog_store(const std::string& host, int port);
// The IPv4 address of the network interface `name` (GLOO_SOCKET_IFNAME, as PyTorch reads it).
std::string interface_address(const std::string& name);
// The local address this host's packets to `host` leave from (its route's source): where the
// other ranks, which reach `host` too, can reach this one.
std::string source_address_towards(const std::string& host, int port);

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
