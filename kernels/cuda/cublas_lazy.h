// cuBLAS and cuBLASLt are opened on first use (cublas_lazy.cpp), not at start-up.
#pragma once

#include <string>

namespace oases::cuda {

// Opens cuBLAS and cuBLASLt now and resolves every function this build forwards to them: "" when
// all are there, else what is missing (the library's dlopen error, or the function's name).
std::string cublas_open_all();

}  // namespace oases::cuda
