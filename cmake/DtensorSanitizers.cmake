# Sanitizer builds (ci/sanitize; docs/building.md, "Sanitizers"):
#   cmake -S . -B build-asan -G Ninja -DDTENSOR_SANITIZE=address,undefined
#   cmake -S . -B build-tsan -G Ninja -DDTENSOR_SANITIZE=thread
# Every target of the project (library, harness, suites, tools; the shared precompiled header
# too, whose flags must match its users') is compiled and linked with the sanitizers. libtorch
# and the other system libraries are not instrumented; ci/sanitizers/*.supp says what that
# costs and what is suppressed because of it.
#
# The compiler is the normal build's (GCC), so ccache serves these builds as it does build/.
include_guard(GLOBAL)
set(DTENSOR_SANITIZE "" CACHE STRING
    "Sanitizers for every target: empty (none), 'address,undefined' or 'thread'")
set_property(CACHE DTENSOR_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

if(DTENSOR_SANITIZE)
  string(REPLACE " " "" _dtensor_sanitize "${DTENSOR_SANITIZE}")
  string(REPLACE "," ";" _dtensor_sanitizers "${_dtensor_sanitize}")
  foreach(_s IN LISTS _dtensor_sanitizers)
    if(NOT _s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "DTENSOR_SANITIZE='${DTENSOR_SANITIZE}': '${_s}' is not one of "
        "address, undefined, thread (try 'address,undefined' or 'thread')")
    endif()
  endforeach()
  if("thread" IN_LIST _dtensor_sanitizers AND "address" IN_LIST _dtensor_sanitizers)
    message(FATAL_ERROR "DTENSOR_SANITIZE='${DTENSOR_SANITIZE}': ThreadSanitizer and "
      "AddressSanitizer cannot be combined; build them in two directories (build-tsan, build-asan)")
  endif()

  # -g1: line tables for the reports' stacks, at a fraction of -g's compile time.
  set(_dtensor_sanitize_flags -fsanitize=${_dtensor_sanitize} -fno-omit-frame-pointer -g1)
  if("undefined" IN_LIST _dtensor_sanitizers)
    # Any UBSan finding fails the test (with halt_on_error=1 in UBSAN_OPTIONS, ci/sanitize).
    list(APPEND _dtensor_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_dtensor_sanitize_flags})
  add_link_options(-fsanitize=${_dtensor_sanitize})
  # gtest_discover_tests runs each test program after it is linked to list its tests; a
  # sanitized program is slow to start and its report would fail the build, so tests are
  # listed when ctest runs instead.
  set(CMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE PRE_TEST)
  message(STATUS "dtensor-cpp: sanitizers ${_dtensor_sanitize} (${_dtensor_sanitize_flags})")
endif()
