/* Stub libnccl.so.2: the real NCCL 2.28 symbol names and C ABI with
 * deterministic, GPU-free semantics, so the NCCL workload can predict every
 * return value and tests can compare the agent's counts with exact ground
 * truth. No process talks to another: a communicator is local bookkeeping
 * (rank, nranks, unique id), which is all a host-side probe can see anyway.
 *
 * Built only with the fixed flags in internal/testutil/build.go, like the
 * CUDA stubs: every exported function starts with "push %rbp".
 *
 * Exported like NCCL's own build (core.h's NCCL_API with PROFAPI, the
 * default): each API name is a WEAK symbol, and the profiling name pncclX
 * is a global alias at the same address. Symbol readers that only take
 * STB_GLOBAL, or that attach once per name rather than once per address,
 * go wrong on the real library, so they must on this one too.
 *
 * Argument checks follow NCCL's ArgsCheck: unknown or NULL communicator,
 * out-of-range root or peer, datatype or reduction op all return
 * ncclInvalidArgument (4), as does a NULL buffer with a non-zero count where
 * the buffer is used. ncclGroupEnd without ncclGroupStart returns
 * ncclInvalidUsage (5). A communicator made non-blocking (config->blocking
 * = 0) returns ncclInProgress (7) from its init, from every second data call
 * made outside a group (the 2nd, 4th, ... that pass the checks), and from
 * the ncclGroupEnd that closes a group holding one of its calls. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_stub.h"

/* NCCL_API of NCCL's core.h (PROFAPI): weak name, global p-alias. */
#define NCCL_API(ret, name, params)                                                      \
	__attribute__((visibility("default"), alias(#name))) ret p##name params;         \
	__attribute__((visibility("default"), weak, noinline)) ret name params

#define EXPORT __attribute__((noinline, visibility("default")))
#define INTERNAL static __attribute__((noinline))

/* The call is never in tail position, so every export starts with
 * "push %rbp" (see WRAP in cudart.c). */
#define WRAP(call)                         \
	do {                               \
		ncclResult_t rc_ = (call); \
		last_rc = rc_;             \
		return rc_;                \
	} while (0)

/* Volatile sinks: observable work, and the last data call for a debugger. */
static volatile uintptr_t sink;
static volatile ncclResult_t last_rc;
static volatile uintptr_t last_send, last_recv, last_comm, last_stream;
static volatile size_t last_count;
static volatile int last_datatype;

#define COMM_MAGIC 0x6e63636c636f6d6dULL /* "ncclcomm" */

struct ncclComm {
	uint64_t magic;
	int rank, nranks, cuda_dev;
	int blocking;
	uint64_t comm_hash; /* NCCL's commHash: DJB2a over the unique id */
	ncclUniqueId id;
	ncclResult_t async; /* ncclInProgress until polled once (non-blocking) */
	uint64_t seq;	    /* data calls outside groups that passed the checks */
};

/* Live communicators, so calls on an unknown or destroyed one fail
 * without dereferencing it. Few per process: a linear scan will do. */
static pthread_mutex_t comms_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm **comms;
static size_t ncomms, comms_cap;

static int comm_add(struct ncclComm *c)
{
	int ok = 1;
	pthread_mutex_lock(&comms_mu);
	if (ncomms == comms_cap) {
		size_t cap = comms_cap ? comms_cap * 2 : 16;
		struct ncclComm **n = realloc(comms, cap * sizeof(*n));
		if (n) {
			comms = n;
			comms_cap = cap;
		} else {
			ok = 0;
		}
	}
	if (ok)
		comms[ncomms++] = c;
	pthread_mutex_unlock(&comms_mu);
	return ok;
}

/* Holds comms_mu on success, so the comm cannot go away under the caller;
 * comm_put releases it. */
static struct ncclComm *comm_get(ncclComm_t c)
{
	pthread_mutex_lock(&comms_mu);
	for (size_t i = 0; c && i < ncomms; i++)
		if (comms[i] == c)
			return c;
	pthread_mutex_unlock(&comms_mu);
	return NULL;
}

static void comm_put(void)
{
	pthread_mutex_unlock(&comms_mu);
}

static int comm_remove(ncclComm_t c)
{
	int found = 0;
	pthread_mutex_lock(&comms_mu);
	for (size_t i = 0; i < ncomms; i++) {
		if (comms[i] == c) {
			comms[i] = comms[--ncomms];
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&comms_mu);
	return found;
}

/* Group state is per thread, as in NCCL. */
static _Thread_local int group_depth;
static _Thread_local int group_nonblocking; /* the open group holds a non-blocking call */
static _Thread_local int cur_device;

static uint64_t delay_ns;
#define NO_BLOCK INT32_MIN
static int block_pending = NO_BLOCK;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleeps until the monotonic clock reaches deadline: at least, never less,
 * whatever signals interrupt the sleep. */
static void sleep_until(uint64_t deadline)
{
	for (uint64_t t = now_ns(); t < deadline; t = now_ns()) {
		struct timespec ts = {(time_t)((deadline - t) / 1000000000u),
				      (long)((deadline - t) % 1000000000u)};
		nanosleep(&ts, NULL);
	}
}

/* The host time a data call spends "enqueueing": the delay, and a pending
 * block taken by exactly one call. */
static void stall(void)
{
	uint64_t start = now_ns();
	int ms = __atomic_exchange_n(&block_pending, NO_BLOCK, __ATOMIC_ACQ_REL);
	if (ms != NO_BLOCK && ms < 0)
		for (;;)
			pause(); /* until killed */
	uint64_t d = __atomic_load_n(&delay_ns, __ATOMIC_RELAXED);
	if (ms != NO_BLOCK)
		d += (uint64_t)ms * 1000000u;
	if (d)
		sleep_until(start + d);
}

/* 64-bit mix (splitmix64 finaliser): unique-looking id bytes. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Laid out like NCCL's bootstrap handle: a random 64-bit magic, then a
 * socket address (AF_INET, a port, 127.0.0.1); the rest zero. */
static void make_id(ncclUniqueId *id)
{
	static uint64_t counter;
	uint64_t n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
	uint64_t magic = mix64(now_ns() ^ ((uint64_t)getpid() << 32) ^ n);
	uint16_t family = 2, port = (uint16_t)(0x7000 + n);
	uint8_t addr[4] = {127, 0, 0, 1};
	memset(id, 0, sizeof(*id));
	memcpy(id->internal, &magic, 8);
	memcpy(id->internal + 8, &family, 2);
	id->internal[10] = (char)(port >> 8); /* network byte order */
	id->internal[11] = (char)port;
	memcpy(id->internal + 12, addr, 4);
}

/* NCCL's getHash (utils.h): DJB2a over the bytes, char being signed. */
static uint64_t djb2a(const char *s, int n)
{
	uint64_t h = 5381;
	for (int i = 0; i < n; i++)
		h = ((h << 5) + h) ^ (uint64_t)(int64_t)s[i];
	return h;
}

INTERNAL ncclResult_t do_get_version(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

INTERNAL ncclResult_t do_get_unique_id(ncclUniqueId *id)
{
	if (!id)
		return ncclInvalidArgument;
	make_id(id);
	return ncclSuccess;
}

static int id_valid(const ncclUniqueId *id)
{
	uint64_t magic;
	memcpy(&magic, id->internal, 8);
	return magic != 0;
}

/* blocking: 1 or 0 (non-blocking). */
static ncclResult_t new_comm(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
			     int dev, int blocking)
{
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (!c)
		return ncclSystemError;
	c->magic = COMM_MAGIC;
	c->rank = rank;
	c->nranks = nranks;
	c->cuda_dev = dev;
	c->blocking = blocking;
	c->id = *id;
	c->comm_hash = djb2a(id->internal, NCCL_UNIQUE_ID_BYTES);
	c->async = blocking ? ncclSuccess : ncclInProgress;
	if (!comm_add(c)) {
		free(c);
		return ncclSystemError;
	}
	*out = c;
	return blocking ? ncclSuccess : ncclInProgress;
}

/* id by pointer: the exported functions take it by value. */
INTERNAL ncclResult_t do_init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id,
				   int rank, const ncclConfig_t *config)
{
	int blocking = 1;
	sink = (uintptr_t)config ^ (unsigned)nranks ^ (unsigned)rank;
	if (!comm)
		return ncclInvalidArgument;
	if (nranks < 1 || rank < 0 || rank >= nranks || !id_valid(id))
		return ncclInvalidArgument;
	if (config) {
		if (config->magic != NCCL_API_MAGIC ||
		    config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
			return ncclInvalidArgument;
		if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
			if (config->blocking != 0 && config->blocking != 1)
				return ncclInvalidArgument;
			blocking = config->blocking;
		}
	}
	return new_comm(comm, nranks, id, rank, cur_device, blocking);
}

/* One process, ndev ranks; the id is made internally, as NCCL does. */
INTERNAL ncclResult_t do_init_all(ncclComm_t *comm, int ndev, const int *devlist)
{
	ncclUniqueId id;
	if (!comm || ndev < 1)
		return ncclInvalidArgument;
	for (int i = 0; devlist && i < ndev; i++)
		if (devlist[i] < 0)
			return ncclInvalidArgument;
	make_id(&id);
	for (int i = 0; i < ndev; i++) {
		ncclResult_t rc = new_comm(&comm[i], ndev, &id, i, devlist ? devlist[i] : i, 1);
		if (rc != ncclSuccess)
			return rc;
	}
	return ncclSuccess;
}

/* Destroy and abort: NULL is a no-op, as in NCCL. */
INTERNAL ncclResult_t do_destroy(ncclComm_t comm)
{
	sink = (uintptr_t)comm;
	if (!comm)
		return ncclSuccess;
	if (!comm_remove(comm))
		return ncclInvalidArgument;
	free(comm);
	return ncclSuccess;
}

/* A non-blocking communicator reports its init in progress once. */
INTERNAL ncclResult_t do_get_async_error(ncclComm_t comm, ncclResult_t *async)
{
	struct ncclComm *c;
	if (!async || !(c = comm_get(comm)))
		return ncclInvalidArgument;
	*async = c->async;
	c->async = ncclSuccess;
	comm_put();
	return ncclSuccess;
}

enum comm_query { Q_COUNT, Q_DEVICE, Q_RANK };

INTERNAL ncclResult_t do_query(ncclComm_t comm, int *out, enum comm_query q)
{
	struct ncclComm *c;
	if (!out || !(c = comm_get(comm)))
		return ncclInvalidArgument;
	*out = q == Q_COUNT ? c->nranks : q == Q_DEVICE ? c->cuda_dev : c->rank;
	comm_put();
	return ncclSuccess;
}

INTERNAL const char *do_error_string(ncclResult_t rc)
{
	switch (rc) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError:
		return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError:
		return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument:
		return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage:
		return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	case ncclInProgress:
		return "NCCL operation in progress";
	case ncclTimeout:
		return "operation timed out";
	default:
		return "unknown result code";
	}
}

/* The data calls, and which arguments each has. A root's buffer (2) is
 * used only on the root. */
enum data_op { D_ALL_REDUCE, D_ALL_GATHER, D_REDUCE_SCATTER, D_BROADCAST, D_REDUCE, D_ALL_TO_ALL,
	       D_SEND, D_RECV };
static const struct {
	unsigned char has_op, has_root, has_peer, send_used, recv_used;
} shape[] = {
	[D_ALL_REDUCE] = {1, 0, 0, 1, 1}, [D_ALL_GATHER] = {0, 0, 0, 1, 1},
	[D_REDUCE_SCATTER] = {1, 0, 0, 1, 1}, [D_BROADCAST] = {0, 1, 0, 2, 1},
	[D_REDUCE] = {1, 1, 0, 1, 2}, [D_ALL_TO_ALL] = {0, 0, 0, 1, 1},
	[D_SEND] = {0, 0, 1, 1, 0}, [D_RECV] = {0, 0, 1, 0, 1},
};

/* Every data call, with its arguments in one order: op and root_or_peer
 * are ignored where the call has none. Arguments are plain scalars so that
 * the exports build nothing before their prologue. */
INTERNAL ncclResult_t do_data(enum data_op d, const void *send, void *recv, size_t count,
			      int datatype, int op, int root_or_peer, ncclComm_t comm,
			      cudaStream_t stream)
{
	last_send = (uintptr_t)send;
	last_recv = (uintptr_t)recv;
	last_count = count;
	last_datatype = datatype;
	last_comm = (uintptr_t)comm;
	last_stream = (uintptr_t)stream;

	struct ncclComm *c = comm_get(comm);
	if (!c)
		return ncclInvalidArgument;
	int nranks = c->nranks, rank = c->rank, blocking = c->blocking;
	comm_put();
	/* Unsigned compares reject negative values too. */
	if (((shape[d].has_root || shape[d].has_peer) &&
	     (unsigned)root_or_peer >= (unsigned)nranks) ||
	    (unsigned)datatype >= ncclNumTypes || (shape[d].has_op && (unsigned)op >= ncclNumOps))
		return ncclInvalidArgument;
	int on_root = shape[d].has_root && rank == root_or_peer;
	int send_used = shape[d].send_used == 1 || (shape[d].send_used == 2 && on_root);
	int recv_used = shape[d].recv_used == 1 || (shape[d].recv_used == 2 && on_root);
	if (count && ((send_used && !send) || (recv_used && !recv)))
		return ncclInvalidArgument;

	stall();
	if (blocking)
		return ncclSuccess;
	if (group_depth) {
		group_nonblocking = 1;
		return ncclSuccess;
	}
	/* Counted under the lock: comm_get succeeds unless destroyed meanwhile. */
	ncclResult_t rc = ncclSuccess;
	if ((c = comm_get(comm))) {
		rc = c->seq++ % 2 ? ncclInProgress : ncclSuccess;
		comm_put();
	}
	return rc;
}

INTERNAL ncclResult_t do_group_start(void)
{
	group_depth++;
	sink = (uintptr_t)group_depth;
	return ncclSuccess;
}

INTERNAL ncclResult_t do_group_end(void)
{
	if (group_depth == 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	int nb = group_nonblocking;
	group_nonblocking = 0;
	return nb ? ncclInProgress : ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetVersion, (int *version))
{
	WRAP(do_get_version(version));
}

NCCL_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))
{
	WRAP(do_get_unique_id(uniqueId));
}

NCCL_API(ncclResult_t, ncclCommInitRank,
	 (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))
{
	WRAP(do_init_rank(comm, nranks, &commId, rank, NULL));
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig,
	 (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config))
{
	WRAP(do_init_rank(comm, nranks, &commId, rank, config));
}

NCCL_API(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int *devlist))
{
	WRAP(do_init_all(comm, ndev, devlist));
}

NCCL_API(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))
{
	WRAP(do_destroy(comm));
}

/* Nothing runs on a device, so aborting is destroying. */
NCCL_API(ncclResult_t, ncclCommAbort, (ncclComm_t comm))
{
	WRAP(do_destroy(comm));
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError))
{
	WRAP(do_get_async_error(comm, asyncError));
}

NCCL_API(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count))
{
	WRAP(do_query(comm, count, Q_COUNT));
}

NCCL_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device))
{
	WRAP(do_query(comm, device, Q_DEVICE));
}

NCCL_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank))
{
	WRAP(do_query(comm, rank, Q_RANK));
}

NCCL_API(const char *, ncclGetErrorString, (ncclResult_t result))
{
	const char *s = do_error_string(result);
	sink = (uintptr_t)s;
	return s;
}

NCCL_API(ncclResult_t, ncclAllReduce,
	 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
{
	WRAP(do_data(D_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream));
}

NCCL_API(ncclResult_t, ncclAllGather,
	 (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
	  ncclComm_t comm, cudaStream_t stream))
{
	WRAP(do_data(D_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream));
}

NCCL_API(ncclResult_t, ncclReduceScatter,
	 (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
	  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
{
	WRAP(do_data(D_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm,
		     stream));
}

NCCL_API(ncclResult_t, ncclBroadcast,
	 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
	  ncclComm_t comm, cudaStream_t stream))
{
	WRAP(do_data(D_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root, comm, stream));
}

NCCL_API(ncclResult_t, ncclReduce,
	 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	  ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))
{
	WRAP(do_data(D_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}

NCCL_API(ncclResult_t, ncclAlltoAll,
	 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	  ncclComm_t comm, cudaStream_t stream))
{
	WRAP(do_data(D_ALL_TO_ALL, sendbuff, recvbuff, count, datatype, 0, 0, comm, stream));
}

NCCL_API(ncclResult_t, ncclSend,
	 (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
	  cudaStream_t stream))
{
	WRAP(do_data(D_SEND, sendbuff, NULL, count, datatype, 0, peer, comm, stream));
}

NCCL_API(ncclResult_t, ncclRecv,
	 (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
	  cudaStream_t stream))
{
	WRAP(do_data(D_RECV, NULL, recvbuff, count, datatype, 0, peer, comm, stream));
}

NCCL_API(ncclResult_t, ncclGroupStart, (void))
{
	WRAP(do_group_start());
}

NCCL_API(ncclResult_t, ncclGroupEnd, (void))
{
	WRAP(do_group_end());
}

EXPORT void profi_stub_nccl_set_delay_ns(uint64_t ns)
{
	__atomic_store_n(&delay_ns, ns, __ATOMIC_RELAXED);
}

EXPORT void profi_stub_nccl_block_next(int ms)
{
	__atomic_store_n(&block_pending, ms == NO_BLOCK ? -1 : ms, __ATOMIC_RELEASE);
}

EXPORT void profi_stub_nccl_set_device(int device)
{
	cur_device = device;
}
