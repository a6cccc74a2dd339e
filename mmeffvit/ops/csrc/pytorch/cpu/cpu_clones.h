// MMEFFVIT_CPU_CLONES: a function compiled twice on x86-64 with GCC, for the x86-64-v3 level
// (AVX2 + FMA: Haswell and later, Zen and later) and for the baseline the package is built for;
// the loader picks the clone by the CPU's features. ("arch=haswell" would test the CPU model,
// not its features: AMD CPUs then ran the much slower baseline clone.)
#pragma once

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && __GNUC__ >= 12
#define MMEFFVIT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MMEFFVIT_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MMEFFVIT_CPU_CLONES
#endif
