# Included after find_package(Torch) by dtensor-cpp's CMakeLists.txt and by its installed
# package config, so a project that uses the installed package links as the build does.
#
# A libtorch from PyTorch's pip wheel (CUDA build) loads the CUDA libraries of the wheel's
# nvidia-* packages (site-packages/nvidia/*/lib, named in libtorch_cuda's RPATH); TorchConfig
# links the CUDA runtime of the CUDA toolkit it found instead (CUDA::cudart). Programs must
# load the wheel's: the toolkit's runtime can be older than the one libtorch was built with
# (here 13.0 against the wheel's 13.2), and a program that loads it first makes libtorch use
# it. So CUDA::cudart is pointed at the wheel's runtime, and whatever links torch resolves
# libtorch's own dependencies (NCCL, cuBLAS, ...) in the wheel's folders, as the loader will
# (docs/building.md, "Today's PyTorch"). Nothing happens for other libtorch builds.
include_guard(GLOBAL)
get_filename_component(DTENSOR_WHEEL_NVIDIA_DIR "${TORCH_INSTALL_PREFIX}/../nvidia" ABSOLUTE)
if(TORCH_CUDA_LIBRARIES AND IS_DIRECTORY "${DTENSOR_WHEEL_NVIDIA_DIR}" AND TARGET torch)
  file(GLOB _dtensor_wheel_libdirs LIST_DIRECTORIES true "${DTENSOR_WHEEL_NVIDIA_DIR}/*/lib")
  foreach(_dir IN LISTS _dtensor_wheel_libdirs)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_dir}")
  endforeach()
  file(GLOB _dtensor_wheel_cudart "${DTENSOR_WHEEL_NVIDIA_DIR}/*/lib/libcudart.so.[0-9]*")
  if(TARGET CUDA::cudart AND _dtensor_wheel_cudart)
    list(GET _dtensor_wheel_cudart 0 _dtensor_wheel_cudart)
    set_property(TARGET CUDA::cudart PROPERTY IMPORTED_LOCATION "${_dtensor_wheel_cudart}")
    message(STATUS "dtensor-cpp: CUDA runtime of the PyTorch wheel: ${_dtensor_wheel_cudart}")
  endif()
endif()
