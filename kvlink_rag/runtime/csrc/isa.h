// The vector code of the instruction set cpu_kernels.py compiles for (its flags decide): AVX512-VNNI or AVX2 + FMA.
#pragma once
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "isa_avx512.h"
#else
#include "isa_avx2.h"
#endif
