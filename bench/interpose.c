//go:build ignore

/* (The constraint above keeps the go tool from taking this for cgo source.)
 *
 * LD_PRELOAD interposer of cuLaunchKernel for the overhead benchmark
 * (bench/overhead_test.go builds it with gcc; never commit the binary). It
 * is the "no kernel, but needs a restart" way of counting launches: a
 * library preloaded into the process defines cuLaunchKernel, so the
 * dynamic linker binds the program's calls to it; it counts the call and
 * forwards it to the real cuLaunchKernel found with dlsym(RTLD_NEXT).
 *
 * The counter is a relaxed atomic, what an interposer in a multithreaded
 * program needs (a plain increment would lose counts between threads).
 * At exit it reports, on stderr,
 *
 *   profi-interpose: cuLaunchKernel calls=N
 *
 * so the benchmark checks N against the calls the loop made, as it checks
 * every other configuration's count. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_drv_stub.h"

static __typeof__(&cuLaunchKernel) next_launch;
static unsigned long launches;

/* Resolved once, before main: a lookup per call would be measured too. */
__attribute__((constructor)) static void resolve(void)
{
	next_launch = (__typeof__(&cuLaunchKernel))dlsym(RTLD_NEXT, "cuLaunchKernel");
	if (!next_launch) {
		fprintf(stderr, "profi-interpose: dlsym(RTLD_NEXT, cuLaunchKernel): %s\n", dlerror());
		exit(4);
	}
}

__attribute__((destructor)) static void report(void)
{
	fprintf(stderr, "profi-interpose: cuLaunchKernel calls=%lu\n",
		__atomic_load_n(&launches, __ATOMIC_RELAXED));
}

CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, unsigned gridDimY, unsigned gridDimZ,
			unsigned blockDimX, unsigned blockDimY, unsigned blockDimZ,
			unsigned sharedMemBytes, CUstream hStream, void **kernelParams,
			void **extra)
{
	__atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
	return next_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
			   sharedMemBytes, hStream, kernelParams, extra);
}
