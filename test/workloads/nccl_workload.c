/* One rank of a torchrun-style NCCL job (one process per rank) driving the
 * stub libnccl.so.2, and printing exact ground truth, so tests can compare
 * what the agent counted with what happened. Ground truth is tallied from
 * the arguments passed and the codes returned, never from formulas. Linked
 * against the stub libnccl.so.2 and libcudart.so.12 (found through its
 * RUNPATH), like a PyTorch process.
 *
 * Flags: --rank R (0), --nranks N (1), --id HEX (the job's ncclUniqueId,
 * 256 hex digits; without it rank 0 makes one with ncclGetUniqueId at
 * "init" and the others must be given one), --device D (R % 4: the CUDA
 * device set before init), --delay-ns N (0: host time every data call
 * takes inside the stub, for a straggler), --iters N (50: steps per "go"),
 * --blocking B (-1: ncclCommInitRank; 0 or 1: ncclCommInitRankConfig with
 * config.blocking = B).
 *
 * stdin protocol, one line per command, each answered with one line:
 *   "init [HEX]"  -> cudaSetDevice, cudaStreamCreate, ncclCommInitRank(Config)
 *                    (polling ncclCommGetAsyncError while non-blocking init
 *                    is in progress) -> JSON {"comm","rank","nranks",
 *                    "device","comm_hash","id","blocking","rc","async"}
 *   "go"          -> one measured phase (iters steps, see step()) -> one
 *                    JSON line of cumulative ground truth (print_truth)
 *   "hang MS [OP]" -> the next data call blocks MS ms in the stub; makes
 *                    one OP call (ncclAllReduce) -> "hung OP RC NS"
 *   "block [OP]"  -> prints "blocking OP", then makes one OP call that
 *                    blocks until the process is killed
 *   "cudablock"   -> prints "cuda-blocking cudaMemcpy", then makes one
 *                    device-to-host cudaMemcpy, which blocks in the stub
 *                    runtime until the process is killed
 *   "delay NS"    -> sets the stub's per-call delay -> "delay NS"
 *   "initall N"   -> ncclCommInitAll of N communicators, one grouped
 *                    ncclAllReduce on each, ncclCommDestroy of each
 *                    -> "initall RC"
 *   "destroy", "abort" -> ncclCommDestroy / ncclCommAbort -> "destroyed RC"
 *                    / "aborted RC"
 *   "exit" or EOF -> exit 0.
 * The first line printed is "ready <pid>". Every call of every command is
 * in the ground truth the next "go" prints (the blocked one excepted: it
 * never returns). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_stub.h"
#include "nccl_stub.h"

/* Every NCCL function the workload calls, in ground-truth order; the data
 * calls (a count and a datatype) first. */
enum {
	O_ALL_REDUCE, O_ALL_GATHER, O_REDUCE_SCATTER, O_BROADCAST, O_REDUCE, O_ALL_TO_ALL, O_SEND,
	O_RECV, NDATA,
	O_GROUP_START = NDATA, O_GROUP_END, O_GET_VERSION, O_GET_UNIQUE_ID, O_INIT_RANK,
	O_INIT_RANK_CONFIG, O_INIT_ALL, O_DESTROY, O_ABORT, O_GET_ASYNC_ERROR, O_COUNT,
	O_USER_RANK, O_CU_DEVICE, O_ERROR_STRING, NOPS
};
static const char *const op_name[NOPS] = {
	"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
	"ncclAlltoAll", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd",
	"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig",
	"ncclCommInitAll", "ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError",
	"ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice", "ncclGetErrorString",
};

/* Bytes per element of each ncclDataType_t value (nccl.h); any other value
 * is unknown and adds 0 bytes. */
static const uint64_t dt_size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

#define MAX_CODES 8
#define MAX_DTS 16
struct dt_row {
	int dt;
	uint64_t calls, elements, bytes, error_calls, error_bytes;
};
static struct {
	uint64_t calls[NOPS];
	struct { int code; uint64_t n; } err[NOPS][MAX_CODES];
	uint64_t ns[NOPS], max_ns[NOPS];
	struct dt_row dts[NDATA][MAX_DTS];
	int ndts[NDATA];
	uint64_t set_device_calls, stream_create_calls;
	/* Collectives (no send/recv) called on the job's communicator, failed
	 * ones included: the rank's position in the communicator's sequence. */
	uint64_t collectives;
} total;

static struct {
	int rank, nranks, device, iters, blocking;
	uint64_t delay_ns;
	const char *id;
} opt = {0, 1, -1, 50, -1, 0, NULL};

static ncclComm_t comm;
static int have_comm;
static ncclUniqueId job_id;
static int have_id;
static cudaStream_t stream;

static void die(const char *msg)
{
	fprintf(stderr, "nccl_workload: %s\n", msg);
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Counts one call of o that returned rc and took ns of host time. */
static void record(int o, int rc, uint64_t ns)
{
	total.calls[o]++;
	total.ns[o] += ns;
	if (ns > total.max_ns[o])
		total.max_ns[o] = ns;
	if (rc == ncclSuccess)
		return;
	for (int i = 0; i < MAX_CODES; i++) {
		if (total.err[o][i].n == 0 || total.err[o][i].code == rc) {
			total.err[o][i].code = rc;
			total.err[o][i].n++;
			return;
		}
	}
	die("too many distinct error codes");
}

static void record_data(int o, int dt, size_t count, int rc)
{
	int i;
	for (i = 0; i < total.ndts[o] && total.dts[o][i].dt != dt; i++)
		;
	if (i == total.ndts[o]) {
		if (i == MAX_DTS)
			die("too many datatypes");
		total.dts[o][i].dt = dt;
		total.ndts[o]++;
	}
	struct dt_row *r = &total.dts[o][i];
	uint64_t bytes = dt >= 0 && dt < ncclNumTypes ? count * dt_size[dt] : 0;
	r->calls++;
	r->elements += count;
	r->bytes += bytes;
	if (rc != ncclSuccess) {
		r->error_calls++;
		r->error_bytes += bytes;
	}
}

/* Wrappers: each makes exactly one NCCL call and accounts for it. */
#define TIMED(o, call)                                  \
	({                                              \
		uint64_t t0_ = now_ns();                \
		ncclResult_t rc_ = (call);              \
		record((o), rc_, now_ns() - t0_);       \
		rc_;                                    \
	})

/* A data call: red is the reduction op, rp the root or peer; each is
 * passed only to the functions that take one. */
static ncclResult_t data(int o, const void *send, void *recv, size_t count, int dt, int red,
			 int rp, ncclComm_t c, cudaStream_t s)
{
	ncclDataType_t t = (ncclDataType_t)dt;
	ncclRedOp_t r = (ncclRedOp_t)red;
	ncclResult_t rc;
	switch (o) {
	case O_ALL_REDUCE:
		rc = TIMED(o, ncclAllReduce(send, recv, count, t, r, c, s));
		break;
	case O_ALL_GATHER:
		rc = TIMED(o, ncclAllGather(send, recv, count, t, c, s));
		break;
	case O_REDUCE_SCATTER:
		rc = TIMED(o, ncclReduceScatter(send, recv, count, t, r, c, s));
		break;
	case O_BROADCAST:
		rc = TIMED(o, ncclBroadcast(send, recv, count, t, rp, c, s));
		break;
	case O_REDUCE:
		rc = TIMED(o, ncclReduce(send, recv, count, t, r, rp, c, s));
		break;
	case O_ALL_TO_ALL:
		rc = TIMED(o, ncclAlltoAll(send, recv, count, t, c, s));
		break;
	case O_SEND:
		rc = TIMED(o, ncclSend(send, count, t, rp, c, s));
		break;
	default:
		rc = TIMED(o, ncclRecv(recv, count, t, rp, c, s));
	}
	record_data(o, dt, count, rc);
	if (o != O_SEND && o != O_RECV && have_comm && c == comm)
		total.collectives++;
	return rc;
}

static ncclResult_t group_start(void)
{
	return TIMED(O_GROUP_START, ncclGroupStart());
}

static ncclResult_t group_end(void)
{
	return TIMED(O_GROUP_END, ncclGroupEnd());
}

/* Fake device buffers: the stub never touches them. */
#define SEND_BUF ((const void *)(uintptr_t)0x7e0000100000ULL)
#define RECV_BUF ((void *)(uintptr_t)0x7e0000200000ULL)

/* Queries a framework makes once per phase (e.g. logging the topology). */
static void queries(void)
{
	int v = 0;
	ncclResult_t async = ncclSuccess;
	TIMED(O_GET_VERSION, ncclGetVersion(&v));
	TIMED(O_COUNT, ncclCommCount(comm, &v));
	TIMED(O_USER_RANK, ncclCommUserRank(comm, &v));
	TIMED(O_CU_DEVICE, ncclCommCuDevice(comm, &v));
	TIMED(O_GET_ASYNC_ERROR, ncclCommGetAsyncError(comm, &async));
	uint64_t t0 = now_ns();
	const char *msg = ncclGetErrorString(ncclInvalidArgument);
	record(O_ERROR_STRING, ncclSuccess, now_ns() - t0);
	if (!msg)
		die("ncclGetErrorString returned NULL");
}

/* One training step's communication: every data call over several
 * datatypes (bf16 and fp8 included), point-to-point in a group, a nested
 * group, and on every 10th step one call per argument error. */
static void step(int i)
{
	int n = opt.nranks, next = (opt.rank + 1) % n, prev = (opt.rank + n - 1) % n;
	for (int d = 0; d < ncclNumTypes; d++)
		data(O_ALL_REDUCE, SEND_BUF, RECV_BUF, 256 * (d + 1) + 8 * (i % 4), d, (i + d) % 5,
		     0, comm, stream);
	static const int ag_dt[] = {ncclFloat32, ncclBfloat16, ncclFloat8e4m3};
	for (int k = 0; k < 3; k++)
		data(O_ALL_GATHER, SEND_BUF, RECV_BUF, 512 + 64 * (i % 3), ag_dt[k], 0, 0, comm,
		     stream);
	static const int rs_dt[] = {ncclFloat32, ncclBfloat16, ncclFloat16};
	for (int k = 0; k < 3; k++) /* on the default stream */
		data(O_REDUCE_SCATTER, SEND_BUF, RECV_BUF, 1024 + 16 * (i % 5), rs_dt[k], ncclSum,
		     0, comm, NULL);
	/* Only the root passes a send buffer, only the root a receive buffer. */
	int root = i % n;
	const void *bsend = opt.rank == root ? SEND_BUF : NULL;
	data(O_BROADCAST, bsend, RECV_BUF, 4096, ncclInt8, 0, root, comm, stream);
	data(O_BROADCAST, bsend, RECV_BUF, 4096, ncclFloat64, 0, root, comm, stream);
	root = (i + 1) % n;
	void *rrecv = opt.rank == root ? RECV_BUF : NULL;
	data(O_REDUCE, SEND_BUF, rrecv, 2048, ncclInt64, ncclMax, root, comm, stream);
	data(O_REDUCE, SEND_BUF, rrecv, 2048, ncclUint64, ncclMax, root, comm, stream);
	size_t a2a = 128 * (i % 4 + 1);
	data(O_ALL_TO_ALL, SEND_BUF, RECV_BUF, a2a, ncclBfloat16, 0, 0, comm, stream);
	data(O_ALL_TO_ALL, SEND_BUF, RECV_BUF, a2a, ncclFloat8e5m2, 0, 0, comm, stream);

	/* A ring exchange, as pipeline parallelism does. */
	static const int p2p_dt[] = {ncclFloat32, ncclBfloat16, ncclUint32};
	group_start();
	for (int k = 0; k < 3; k++) {
		data(O_SEND, SEND_BUF, NULL, 2048 + p2p_dt[k], p2p_dt[k], 0, next, comm, stream);
		data(O_RECV, NULL, RECV_BUF, 2048 + p2p_dt[k], p2p_dt[k], 0, prev, comm, stream);
	}
	group_end();

	/* Nested groups: only the outer end launches. */
	group_start();
	group_start();
	data(O_ALL_REDUCE, SEND_BUF, RECV_BUF, 1 << 20, ncclBfloat16, ncclSum, 0, comm, stream);
	group_end();
	data(O_ALL_GATHER, SEND_BUF, RECV_BUF, 4096, ncclFloat8e5m2, 0, 0, comm, stream);
	group_end();

	if (i % 10)
		return;
	/* Argument errors, each 4 (ncclInvalidArgument) except the unmatched
	 * group end (5); bytes still count where the datatype is known. */
	data(O_ALL_REDUCE, SEND_BUF, RECV_BUF, 4096, ncclNumTypes, ncclSum, 0, comm, stream);
	data(O_SEND, SEND_BUF, NULL, 1024, -1, 0, next, comm, stream);
	data(O_ALL_GATHER, SEND_BUF, RECV_BUF, 256, ncclFloat32, 0, 0, NULL, stream);
	data(O_BROADCAST, SEND_BUF, RECV_BUF, 64, ncclInt32, 0, n, comm, stream);
	data(O_RECV, NULL, RECV_BUF, 64, ncclFloat16, 0, -1, comm, stream);
	data(O_ALL_REDUCE, SEND_BUF, RECV_BUF, 512, ncclFloat16, 99, 0, comm, stream);
	group_end();
	/* A count beyond 32 bits succeeds: 4 GiB + 512 bytes of int8. */
	data(O_BROADCAST, SEND_BUF, RECV_BUF, (1ULL << 32) + 512, ncclInt8, 0, 0, comm, stream);
}

static void print_hex(const char *key, const ncclUniqueId *id)
{
	printf("\"%s\":\"", key);
	for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
		printf("%02x", (unsigned char)id->internal[i]);
	printf("\"");
}

/* NCCL's commHash (getHash in utils.h): DJB2a over the id as C chars (signed on x86-64, unsigned on arm64). */
static uint64_t comm_hash(const ncclUniqueId *id)
{
	uint64_t h = 5381;
	for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
		h = ((h << 5) + h) ^ (uint64_t)(int64_t)id->internal[i];
	return h;
}

/* The rank's identity: shared by the init line and the ground truth. */
static void print_identity(void)
{
	printf("\"comm\":\"%#" PRIxPTR "\",\"rank\":%d,\"nranks\":%d,\"device\":%d,"
	       "\"comm_hash\":\"%#" PRIx64 "\",",
	       (uintptr_t)comm, opt.rank, opt.nranks, opt.device, comm_hash(&job_id));
	print_hex("id", &job_id);
	printf(",\"blocking\":%d", opt.blocking);
}

static void print_truth(void)
{
	printf("{\"pid\":%d,", (int)getpid());
	print_identity();
	printf(",\"delay_ns\":%" PRIu64 ",\"collectives\":%" PRIu64 ",\"calls\":{", opt.delay_ns,
	       total.collectives);
	for (int o = 0; o < NOPS; o++)
		printf("%s\"%s\":%" PRIu64, o ? "," : "", op_name[o], total.calls[o]);
	printf("},\"errors\":{");
	for (int o = 0, first = 1; o < NOPS; o++) {
		if (!total.err[o][0].n)
			continue;
		printf("%s\"%s\":{", first ? "" : ",", op_name[o]);
		first = 0;
		for (int c = 0; c < MAX_CODES && total.err[o][c].n; c++)
			printf("%s\"%d\":%" PRIu64, c ? "," : "", total.err[o][c].code,
			       total.err[o][c].n);
		printf("}");
	}
	printf("},\"bytes\":{");
	for (int o = 0; o < NDATA; o++) {
		uint64_t b = 0;
		for (int i = 0; i < total.ndts[o]; i++)
			b += total.dts[o][i].bytes;
		printf("%s\"%s\":%" PRIu64, o ? "," : "", op_name[o], b);
	}
	printf("},\"by_datatype\":{");
	for (int o = 0, first = 1; o < NDATA; o++) {
		if (!total.ndts[o])
			continue;
		printf("%s\"%s\":{", first ? "" : ",", op_name[o]);
		first = 0;
		for (int i = 0; i < total.ndts[o]; i++) {
			const struct dt_row *r = &total.dts[o][i];
			printf("%s\"%d\":{\"calls\":%" PRIu64 ",\"elements\":%" PRIu64
			       ",\"bytes\":%" PRIu64 ",\"error_calls\":%" PRIu64
			       ",\"error_bytes\":%" PRIu64 "}",
			       i ? "," : "", r->dt, r->calls, r->elements, r->bytes, r->error_calls,
			       r->error_bytes);
		}
		printf("}");
	}
	printf("},\"host_ns\":{");
	for (int o = 0; o < NOPS; o++)
		printf("%s\"%s\":%" PRIu64, o ? "," : "", op_name[o], total.ns[o]);
	printf("},\"host_ns_max\":{");
	for (int o = 0; o < NOPS; o++)
		printf("%s\"%s\":%" PRIu64, o ? "," : "", op_name[o], total.max_ns[o]);
	printf("},\"cuda_calls\":{\"cudaSetDevice\":%" PRIu64 ",\"cudaStreamCreate\":%" PRIu64
	       "}}\n",
	       total.set_device_calls, total.stream_create_calls);
	fflush(stdout);
}

static int parse_id(const char *hex, ncclUniqueId *id)
{
	if (strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES)
		return 0;
	for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return 0;
		id->internal[i] = (char)v;
	}
	return 1;
}

static void init(const char *hex)
{
	if (hex || opt.id) {
		if (!parse_id(hex ? hex : opt.id, &job_id))
			die("bad unique id: want 256 hex digits");
		have_id = 1;
	} else if (!have_id) {
		if (opt.rank != 0)
			die("ranks other than 0 need --id or \"init HEX\"");
		if (TIMED(O_GET_UNIQUE_ID, ncclGetUniqueId(&job_id)) != ncclSuccess)
			die("ncclGetUniqueId failed");
		have_id = 1;
	}
	/* What a framework does first: pick the rank's device and a stream. */
	total.set_device_calls++;
	if (cudaSetDevice(opt.device) != cudaSuccess)
		die("cudaSetDevice failed");
	profi_stub_nccl_set_device(opt.device);
	if (!stream) {
		total.stream_create_calls++;
		if (cudaStreamCreate(&stream) != cudaSuccess)
			die("cudaStreamCreate failed");
	}

	ncclResult_t rc, async = ncclSuccess;
	if (opt.blocking < 0) {
		rc = TIMED(O_INIT_RANK, ncclCommInitRank(&comm, opt.nranks, job_id, opt.rank));
	} else {
		ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
		config.blocking = opt.blocking;
		rc = TIMED(O_INIT_RANK_CONFIG,
			   ncclCommInitRankConfig(&comm, opt.nranks, job_id, opt.rank, &config));
	}
	if (rc == ncclInProgress) {
		/* Non-blocking init: poll until it settles, as NCCL asks. */
		for (int tries = 0; tries < 100; tries++) {
			TIMED(O_GET_ASYNC_ERROR, ncclCommGetAsyncError(comm, &async));
			if (async != ncclInProgress)
				break;
		}
	}
	have_comm = rc == ncclSuccess || rc == ncclInProgress;
	profi_stub_nccl_set_delay_ns(opt.delay_ns);
	printf("{");
	print_identity();
	printf(",\"rc\":%d,\"async\":%d}\n", rc, async);
	fflush(stdout);
}

static int op_by_name(const char *name)
{
	if (!name || !*name)
		return O_ALL_REDUCE;
	for (int o = 0; o < NDATA; o++)
		if (!strcmp(name, op_name[o]))
			return o;
	die("unknown data call");
	return -1;
}

/* The one data call "hang" and "block" make: 4 MiB of float32. */
static ncclResult_t one_call(int o)
{
	int peer = (opt.rank + 1) % opt.nranks;
	return data(o, SEND_BUF, RECV_BUF, 1 << 20, ncclFloat32, ncclSum,
		    o == O_SEND || o == O_RECV ? peer : 0, comm, stream);
}

static void init_all(int ndev)
{
	ncclComm_t comms[8];
	if (ndev < 1 || ndev > 8)
		die("initall: 1 to 8 communicators");
	ncclResult_t rc = TIMED(O_INIT_ALL, ncclCommInitAll(comms, ndev, NULL));
	if (rc == ncclSuccess) {
		/* One process driving several devices: one group over all. */
		group_start();
		for (int i = 0; i < ndev; i++)
			data(O_ALL_REDUCE, SEND_BUF, RECV_BUF, 1024, ncclFloat32, ncclSum, 0,
			     comms[i], NULL);
		group_end();
		for (int i = 0; i < ndev; i++)
			TIMED(O_DESTROY, ncclCommDestroy(comms[i]));
	}
	printf("initall %d\n", rc);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static const struct { const char *name; int *v; long min, max; } int_opts[] = {
		{"--rank", &opt.rank, 0, 4096}, {"--nranks", &opt.nranks, 1, 4096},
		{"--device", &opt.device, 0, 3}, {"--iters", &opt.iters, 0, 1000000},
		{"--blocking", &opt.blocking, -1, 1},
	};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		size_t o;
		for (o = 0; o < sizeof(int_opts) / sizeof(int_opts[0]); o++)
			if (!strcmp(a, int_opts[o].name))
				break;
		if (o < sizeof(int_opts) / sizeof(int_opts[0]) && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);
			if (*end || end == argv[i] || v < int_opts[o].min || v > int_opts[o].max)
				die("bad option value");
			*int_opts[o].v = (int)v;
		} else if (!strcmp(a, "--delay-ns") && i + 1 < argc) {
			char *end;
			opt.delay_ns = strtoull(argv[++i], &end, 10);
			if (*end || end == argv[i])
				die("bad option value");
		} else if (!strcmp(a, "--id") && i + 1 < argc) {
			opt.id = argv[++i];
		} else {
			fprintf(stderr, "nccl_workload: bad argument %s\n", a);
			return 2;
		}
	}
	if (opt.rank >= opt.nranks)
		die("--rank must be below --nranks");
	if (opt.device < 0)
		opt.device = opt.rank % 4; /* the stub runtime has 4 devices */

	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	char line[1024];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		char *cmd = strtok(line, " "), *arg = strtok(NULL, " "), *arg2 = strtok(NULL, " ");
		if (!cmd)
			continue;
		if (!strcmp(cmd, "init")) {
			init(arg);
		} else if (!strcmp(cmd, "go")) {
			if (!have_comm)
				die("\"go\" before a successful \"init\"");
			queries();
			for (int i = 0; i < opt.iters; i++)
				step(i);
			print_truth();
		} else if (!strcmp(cmd, "hang") && arg) {
			int o = op_by_name(arg2);
			profi_stub_nccl_block_next(atoi(arg));
			uint64_t t0 = now_ns();
			ncclResult_t rc = one_call(o);
			printf("hung %s %d %" PRIu64 "\n", op_name[o], rc, now_ns() - t0);
			fflush(stdout);
		} else if (!strcmp(cmd, "block")) {
			int o = op_by_name(arg);
			profi_stub_nccl_block_next(-1);
			printf("blocking %s\n", op_name[o]);
			fflush(stdout);
			one_call(o);
			die("a blocked call returned");
		} else if (!strcmp(cmd, "cudablock")) {
			char buf[64];
			profi_stub_cuda_block_next_copy();
			printf("cuda-blocking cudaMemcpy\n");
			fflush(stdout);
			cudaMemcpy(buf, buf, sizeof buf, cudaMemcpyDeviceToHost);
			die("a blocked copy returned");
		} else if (!strcmp(cmd, "delay") && arg) {
			opt.delay_ns = strtoull(arg, NULL, 10);
			profi_stub_nccl_set_delay_ns(opt.delay_ns);
			printf("delay %" PRIu64 "\n", opt.delay_ns);
			fflush(stdout);
		} else if (!strcmp(cmd, "initall") && arg) {
			init_all(atoi(arg));
		} else if (!strcmp(cmd, "destroy") || !strcmp(cmd, "abort")) {
			int d = cmd[0] == 'd';
			ncclResult_t rc = d ? TIMED(O_DESTROY, ncclCommDestroy(comm))
					    : TIMED(O_ABORT, ncclCommAbort(comm));
			printf("%s %d\n", d ? "destroyed" : "aborted", rc);
			fflush(stdout);
		} else if (!strcmp(cmd, "exit")) {
			break;
		} else {
			fprintf(stderr, "nccl_workload: unexpected command \"%s\"\n", cmd);
			return 2;
		}
	}
	return 0;
}
