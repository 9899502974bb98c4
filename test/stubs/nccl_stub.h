/* Minimal NCCL 2.28 types and prototypes shared by the stub libnccl.so.2
 * (nccl.c) and the NCCL workload. Layouts, enum values and calling
 * conventions match the real nccl.h on x86-64 SysV, so uprobes read the
 * same registers and stack slots: in particular ncclUniqueId is a 128-byte
 * struct passed BY VALUE to ncclCommInitRank(Config), which puts it in
 * memory on the caller's stack (at sp+8 at the callee's first instruction),
 * not in a register; rank, after it, takes the third integer register
 * (rdx) and config the fourth (rcx). */
#ifndef PROFI_NCCL_STUB_H
#define PROFI_NCCL_STUB_H

#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 3
/* NCCL_VERSION(X,Y,Z) for 2.9 and later: X*10000 + Y*100 + Z. */
#define NCCL_VERSION_CODE (NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH)

typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t; /* the same tag as the CUDA stubs' */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclTimeout = 8,
	ncclNumResults = 9
} ncclResult_t;

typedef enum {
	ncclSum = 0,
	ncclProd = 1,
	ncclMax = 2,
	ncclMin = 3,
	ncclAvg = 4,
	ncclNumOps = 5,
	ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
	ncclInt8 = 0,
	ncclChar = 0,
	ncclUint8 = 1,
	ncclInt32 = 2,
	ncclInt = 2,
	ncclUint32 = 3,
	ncclInt64 = 4,
	ncclUint64 = 5,
	ncclFloat16 = 6,
	ncclHalf = 6,
	ncclFloat32 = 7,
	ncclFloat = 7,
	ncclFloat64 = 8,
	ncclDouble = 8,
	ncclBfloat16 = 9,
	ncclFloat8e4m3 = 10,
	ncclFloat8e5m2 = 11,
	ncclNumTypes = 12
} ncclDataType_t;

/* The leading fields of ncclConfig_t as of NCCL 2.18; later releases only
 * append fields, and NCCL reads no more than config->size bytes. */
#define NCCL_CONFIG_UNDEF_INT INT32_MIN
#define NCCL_API_MAGIC 0xcafebeef
typedef struct ncclConfig_v21800 {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                    \
	{                                                                                          \
		sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT,    \
			NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NULL, \
			NCCL_CONFIG_UNDEF_INT                                                      \
	}

_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId size");
_Static_assert(offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t.blocking offset");

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
				    ncclConfig_t *config);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
			   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
			   cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
			   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
			       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
			       cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
			   ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
			ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
			cudaStream_t stream);
/* ncclAlltoAll (lower-case "to"), as NVIDIA's nccl.h spells it since 2.28;
 * ncclAllToAll is RCCL's and Meta's spelling. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
			  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* Stub-private controls (no NCCL names, so no probe ever matches them).
 * They act on the data calls: the collectives, ncclSend and ncclRecv.
 *
 * set_delay_ns: from now on every data call that passes argument checks
 * waits at least ns nanoseconds of host time (monotonic clock) before it
 * returns: a straggler. 0 turns it off.
 *
 * block_next: the next data call that passes argument checks, on any
 * thread, blocks inside the stub for ms milliseconds, or until the process
 * is killed when ms < 0: an in-flight call for hang detection.
 *
 * set_device: the calling thread's current CUDA device as the library sees
 * it, which ncclCommInitRank(Config) records (ncclCommCuDevice). The real
 * libnccl links the CUDA runtime statically, so its cudaGetDevice never
 * reaches libcudart.so's exports; the workload mirrors its cudaSetDevice
 * here instead. Default 0. */
void profi_stub_nccl_set_delay_ns(uint64_t ns);
void profi_stub_nccl_block_next(int ms);
void profi_stub_nccl_set_device(int device);

#endif
