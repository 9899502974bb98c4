/* Minimal CUDA Driver API 12 types and prototypes shared by the stub
 * libcuda.so.1 (cuda.c), the stub libcudart (which calls into it) and the
 * workload. Layouts and calling conventions match the real cuda.h on x86-64
 * SysV, so uprobes read the same registers and struct offsets. */
#ifndef PROFI_CUDA_DRV_STUB_H
#define PROFI_CUDA_DRV_STUB_H

#include <stddef.h>

typedef int CUresult;
/* Same struct tags as the runtime's handles, as in the real headers: a
 * cudaStream_t is a CUstream. */
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUgraphExec_st *CUgraphExec;

typedef struct {
	unsigned gridDimX, gridDimY, gridDimZ;
	unsigned blockDimX, blockDimY, blockDimZ;
	unsigned sharedMemBytes;
	CUstream hStream;
	void *attrs; /* CUlaunchAttribute *: never read by the stub */
	unsigned numAttrs;
} CUlaunchConfig;

/* Probes read the stream of cuLaunchKernelEx from this offset. */
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream offset");

/* Codes the stub returns (values from cuda.h). */
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
};

/* X-macro over every exported function: name, parameter list. All return
 * CUresult. The workload uses it to declare dlsym'd pointers. */
#define PROFI_CU_FUNCS(X)                                                     \
	X(cuInit, (unsigned flags))                                           \
	X(cuLaunchKernel, (CUfunction f, unsigned gridDimX, unsigned gridDimY, \
			   unsigned gridDimZ, unsigned blockDimX,             \
			   unsigned blockDimY, unsigned blockDimZ,            \
			   unsigned sharedMemBytes, CUstream hStream,         \
			   void **kernelParams, void **extra))                \
	X(cuLaunchKernel_ptsz, (CUfunction f, unsigned gridDimX,              \
				unsigned gridDimY, unsigned gridDimZ,         \
				unsigned blockDimX, unsigned blockDimY,       \
				unsigned blockDimZ, unsigned sharedMemBytes,  \
				CUstream hStream, void **kernelParams,        \
				void **extra))                                \
	X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f,      \
			     void **kernelParams, void **extra))              \
	X(cuLaunchCooperativeKernel, (CUfunction f, unsigned gridDimX,        \
				      unsigned gridDimY, unsigned gridDimZ,   \
				      unsigned blockDimX, unsigned blockDimY, \
				      unsigned blockDimZ,                     \
				      unsigned sharedMemBytes,                \
				      CUstream hStream, void **kernelParams)) \
	X(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))          \
	X(cuModuleLoadData, (CUmodule * module, const void *image))           \
	X(cuModuleGetFunction, (CUfunction * hfunc, CUmodule hmod,            \
				const char *name))                            \
	X(cuLibraryLoadData, (CUlibrary * library, const void *code,          \
			      void *jitOptions, void **jitOptionsValues,      \
			      unsigned numJitOptions, void *libraryOptions,   \
			      void **libraryOptionValues,                     \
			      unsigned numLibraryOptions))                    \
	X(cuLibraryGetKernel, (CUkernel * pKernel, CUlibrary library,         \
			       const char *name))                             \
	X(cuKernelGetFunction, (CUfunction * pFunc, CUkernel kernel))

#define PROFI_DECLARE_CU_FUNC(name, params) CUresult name params;
PROFI_CU_FUNCS(PROFI_DECLARE_CU_FUNC)
#undef PROFI_DECLARE_CU_FUNC

#endif
