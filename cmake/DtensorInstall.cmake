# Installable CMake package: find_package(dtensor_cpp) gives dtensor::dtensor (the library),
# dtensor::models (the reference models), dtensor::harness (the gtest fixtures) and
# dtensor::harness_main (main() with the fork server).
include(CMakePackageConfigHelpers)

set(DTENSOR_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/dtensor_cpp)
set(_dtensor_targets dtensor dtensor_models)
if(DTENSOR_BUILD_TESTS)
  set_target_properties(dtensor_harness PROPERTIES EXPORT_NAME harness)
  set_target_properties(dtensor_harness_main PROPERTIES EXPORT_NAME harness_main)
  list(APPEND _dtensor_targets dtensor_harness dtensor_harness_main)
endif()
set(DTENSOR_PACKAGE_HAS_HARNESS ${DTENSOR_BUILD_TESTS})

install(TARGETS ${_dtensor_targets} EXPORT dtensor_cppTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The public headers: a user includes these. The library's insides (*_internal.h, internal/
# and detail/ folders) are not installed; the consumer project (examples/consumer) compiles
# every installed header, so a public header that needs an internal one fails there.
set(_dtensor_private PATTERN "*_internal.h" EXCLUDE PATTERN "internal" EXCLUDE PATTERN "detail" EXCLUDE)
install(DIRECTORY dtensor DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h" ${_dtensor_private})
install(DIRECTORY models DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h" ${_dtensor_private})
if(DTENSOR_BUILD_TESTS)
  install(DIRECTORY harness DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h" ${_dtensor_private})
endif()
install(EXPORT dtensor_cppTargets NAMESPACE dtensor:: DESTINATION ${DTENSOR_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dtensor_cppConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dtensor_cppConfig.cmake INSTALL_DESTINATION ${DTENSOR_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtensor_cppConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtensor_cppConfig.cmake
              ${PROJECT_BINARY_DIR}/dtensor_cppConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/DtensorTorchWheel.cmake
        DESTINATION ${DTENSOR_INSTALL_CMAKEDIR})
