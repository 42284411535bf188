# One precompiled header shared by every target (DESIGN.md D8). Targets call
# dtensor_use_pch(<target>); the .gch is built once by dtensor_pch.
if(DTENSOR_USE_PCH)
  add_library(dtensor_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(dtensor_pch PRIVATE torch nlohmann_json::nlohmann_json)
  target_precompile_headers(dtensor_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/pch.h)
endif()

function(dtensor_use_pch target)
  if(DTENSOR_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM dtensor_pch)
  endif()
endfunction()
