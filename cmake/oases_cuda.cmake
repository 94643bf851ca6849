# The CUDA backend's toolchain: included from the top-level CMakeLists.txt when OASES_CUDA is ON,
# or AUTO and nvcc is found. Sets OASES_WITH_CUDA and the imported targets the backend links:
# CUDA::cudart, oases::cudnn, oases::nccl, and, when its headers are found, oases::cudnn_frontend
# (OASES_WITH_CUDNN_FRONTEND); cuBLAS and cuBLASLt are opened on first use (kernels/cuda/cublas_lazy.cpp).
#
# CMake 3.25 cannot hand nvcc C++20, so device code is C++17 (host code stays C++20); CUDA 13 needs
# sm_75 or newer and "native" fails without a GPU, so the architectures default to 80 and 90.

set(OASES_WITH_CUDA OFF)
if(OASES_CUDA STREQUAL "OFF")
  return()
endif()
if(NOT OASES_CUDA MATCHES "^(AUTO|ON)$")
  message(FATAL_ERROR "OASES_CUDA must be AUTO, ON or OFF (got '${OASES_CUDA}')")
endif()

# nvcc is often installed off PATH
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(OASES_CUDA STREQUAL "ON")
    message(FATAL_ERROR "OASES_CUDA=ON but no CUDA compiler (nvcc) was found; set CUDACXX or use -DOASES_CUDA=AUTO|OFF")
  endif()
  message(STATUS "CUDA backend: off (no nvcc found)")
  return()
endif()

# CUDAARCHS in the environment (CMake's own variable; .ci/run sets 90: every source still compiles,
# for one architecture) or -DCMAKE_CUDA_ARCHITECTURES pick others
if((NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "") AND "$ENV{CUDAARCHS}" STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# cuDNN and NCCL sit next to the toolkit (or in the system paths)
find_library(OASES_CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
find_path(OASES_CUDNN_INCLUDE_DIR NAMES cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(OASES_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
find_path(OASES_NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
foreach(v OASES_CUDNN_LIBRARY OASES_CUDNN_INCLUDE_DIR OASES_NCCL_LIBRARY OASES_NCCL_INCLUDE_DIR)
  if(NOT ${v})
    if(OASES_CUDA STREQUAL "ON")
      message(FATAL_ERROR "OASES_CUDA=ON: ${v} not found (the GPU backend needs cuDNN 9 and NCCL 2)")
    endif()
    message(STATUS "CUDA backend: off (${v} not found)")
    return()
  endif()
endforeach()
add_library(oases::cudnn UNKNOWN IMPORTED)
set_target_properties(oases::cudnn PROPERTIES IMPORTED_LOCATION ${OASES_CUDNN_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${OASES_CUDNN_INCLUDE_DIR})
add_library(oases::nccl UNKNOWN IMPORTED)
set_target_properties(oases::nccl PROPERTIES IMPORTED_LOCATION ${OASES_NCCL_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${OASES_NCCL_INCLUDE_DIR})

# The cuDNN frontend: header-only, fetched into .deps by scripts/setup_cudnn_frontend.sh (or point
# OASES_CUDNN_FRONTEND_INCLUDE_DIR at another copy). Optional: without it the fused attention of
# kernels/cuda/attention_cudnn.cpp refuses every call ("built without the cuDNN frontend").
find_path(OASES_CUDNN_FRONTEND_INCLUDE_DIR NAMES cudnn_frontend.h cudnn_frontend_version.h
          HINTS ${CMAKE_SOURCE_DIR}/.deps/cudnn_frontend/include ${CUDAToolkit_INCLUDE_DIRS}
          DOC "Folder holding cudnn_frontend.h (scripts/setup_cudnn_frontend.sh fetches it into .deps/cudnn_frontend/include)")
set(OASES_WITH_CUDNN_FRONTEND OFF)
set(frontend_note "cuDNN frontend not found: bash scripts/setup_cudnn_frontend.sh, or -DOASES_CUDNN_FRONTEND_INCLUDE_DIR=DIR")
if(OASES_CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS ${OASES_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h)
  file(STRINGS ${OASES_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h fe_lines
       REGEX "#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION [0-9]+")
  set(fe_version "")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUDNN_FRONTEND_${part}_VERSION ([0-9]+)" _ "${fe_lines}")
    list(APPEND fe_version ${CMAKE_MATCH_1})
  endforeach()
  list(JOIN fe_version "." fe_version)
  # the graph API with generate_stats and diagonal bands (1.13); written and compiled against 1.32.0
  if(fe_version VERSION_LESS 1.13)
    set(frontend_note "cuDNN frontend ${fe_version} at ${OASES_CUDNN_FRONTEND_INCLUDE_DIR} is too old (1.13 or newer; 1.32.0 is pinned)")
  else()
    add_library(oases::cudnn_frontend INTERFACE IMPORTED)
    # CUDNN_FRONTEND_SKIP_JSON_LIB: no serialisation, and no second copy of nlohmann::json
    # its experimental engines compile kernels with NVRTC (a CUDA runtime library, as cuBLAS is)
    set_target_properties(oases::cudnn_frontend PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${OASES_CUDNN_FRONTEND_INCLUDE_DIR}
                          INTERFACE_COMPILE_DEFINITIONS "OASES_WITH_CUDNN_FRONTEND=1;CUDNN_FRONTEND_SKIP_JSON_LIB"
                          INTERFACE_LINK_LIBRARIES "CUDA::nvrtc;${CMAKE_DL_LIBS}")
    set(OASES_WITH_CUDNN_FRONTEND ON)
    set(frontend_note "cuDNN frontend ${fe_version}")
  endif()
endif()

set(OASES_WITH_CUDA ON)
message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
               "cuDNN ${OASES_CUDNN_LIBRARY}, NCCL ${OASES_NCCL_LIBRARY}, ${frontend_note})")
