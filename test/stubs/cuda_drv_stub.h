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
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 */
typedef unsigned long long CUmemGenericAllocationHandle;

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

/* The driver memory API (CUDA 11.8-13 names: the _v2 entry points that
 * cuda.h's macros and cuGetProcAddress resolve to, their per-thread-stream
 * variants, and the VMM calls). Prototypes as in cuda.h; the property
 * structs are opaque here (the stub never reads them). */
#define PROFI_CU_MEM_FUNCS(X)                                                          \
	X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))                      \
	X(cuMemFree_v2, (CUdeviceptr dptr))                                           \
	X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))  \
	X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))                       \
	X(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned flags))  \
	X(cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))             \
	X(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t ByteCount))      \
	X(cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t ByteCount))           \
	X(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount))      \
	X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyPeer, (CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx, size_t ByteCount)) \
	X(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr dst, const void *src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemsetD8_v2, (CUdeviceptr dst, unsigned char uc, size_t N))               \
	X(cuMemsetD16_v2, (CUdeviceptr dst, unsigned short us, size_t N))             \
	X(cuMemsetD32_v2, (CUdeviceptr dst, unsigned ui, size_t N))                   \
	X(cuMemsetD32Async, (CUdeviceptr dst, unsigned ui, size_t N, CUstream hStream)) \
	X(cuMemCreate, (CUmemGenericAllocationHandle * handle, size_t size, const void *prop, unsigned long long flags)) \
	X(cuMemRelease, (CUmemGenericAllocationHandle handle))                        \
	X(cuMemAddressReserve, (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
	X(cuMemAddressFree, (CUdeviceptr ptr, size_t size))                           \
	X(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
	X(cuMemUnmap, (CUdeviceptr ptr, size_t size))

#define PROFI_DECLARE_CU_MEM(name, params) CUresult name params;
PROFI_CU_MEM_FUNCS(PROFI_DECLARE_CU_MEM)
#undef PROFI_DECLARE_CU_MEM

/* The driver's launch API as code that calls the driver directly uses it
 * (Triton, statically linked runtimes), with the per-thread-default-stream
 * variants cuGetProcAddress hands out under
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (CUDA 11.8-13 names). */
#define PROFI_CU_LAUNCH_FUNCS(X)                                                      \
	X(cuLaunchKernel, (CUfunction f, unsigned gridDimX, unsigned gridDimY,        \
			   unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY, \
			   unsigned blockDimZ, unsigned sharedMemBytes, CUstream hStream, \
			   void **kernelParams, void **extra))                        \
	X(cuLaunchKernel_ptsz, (CUfunction f, unsigned gridDimX, unsigned gridDimY,   \
				unsigned gridDimZ, unsigned blockDimX, unsigned blockDimY, \
				unsigned blockDimZ, unsigned sharedMemBytes,          \
				CUstream hStream, void **kernelParams, void **extra)) \
	X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f,              \
			     void **kernelParams, void **extra))                      \
	X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f,         \
				  void **kernelParams, void **extra))                 \
	X(cuLaunchCooperativeKernel, (CUfunction f, unsigned gridDimX, unsigned gridDimY, \
				      unsigned gridDimZ, unsigned blockDimX,          \
				      unsigned blockDimY, unsigned blockDimZ,         \
				      unsigned sharedMemBytes, CUstream hStream,      \
				      void **kernelParams))                           \
	X(cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned gridDimX,           \
					   unsigned gridDimY, unsigned gridDimZ,      \
					   unsigned blockDimX, unsigned blockDimY,    \
					   unsigned blockDimZ, unsigned sharedMemBytes, \
					   CUstream hStream, void **kernelParams))    \
	X(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))                  \
	X(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))

#define PROFI_DECLARE_CU_LAUNCH(name, params) CUresult name params;
PROFI_CU_LAUNCH_FUNCS(PROFI_DECLARE_CU_LAUNCH)
#undef PROFI_DECLARE_CU_LAUNCH

#endif
