//go:build ignore

/* (The constraint above keeps the go tool from taking this for cgo source.)
 *
 * NCCL driver of the overhead benchmark (bench/overhead_test.go and
 * bench/nccl_overhead_test.go build it with gcc; never commit the binary).
 * The same protocol as bench/loop.c, on the stub libnccl.so.2: it prints
 *
 *   ready pid=PID
 *
 * and waits for a line on stdin, so that the benchmark can attach its probes
 * to this very process. Then it makes one communicator, as a one-rank job
 * does (ncclGetUniqueId, then ncclCommInitRank with nranks 1, rank 0), calls
 * ncclAllReduce WARMUP times untimed (resolving the PLT slot, faulting the
 * pages in) and CALLS times timed, and prints
 *
 *   pid=PID calls=CALLS warmup=WARMUP elapsed_ns=NS
 *
 * where NS covers the CALLS timed calls only. Every call is a valid
 * out-of-place sum of COUNT (1024) float32 on the communicator and the
 * default stream: 4096 bytes per call, which profi records. The
 * communicator is made after the go-ahead, so a profi attached while the
 * loop waits counts its init exactly once (ncclCommInitRank, its own
 * operation). Exits 1 if any call fails, so a broken stub cannot pass for
 * a fast one, and 3 if stdin ends before the go-ahead line.
 *
 * Usage: nccl_loop ncclAllReduce CALLS WARMUP */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loop.h"
#include "nccl_stub.h"

#define COUNT 1024

static float sendbuf[COUNT], recvbuf[COUNT];

static ncclComm_t comm;

static long calls_all_reduce(long n)
{
	long failed = 0;

	for (long i = 0; i < n; i++)
		failed += ncclAllReduce(sendbuf, recvbuf, COUNT, ncclFloat32, ncclSum, comm, NULL) !=
			  ncclSuccess;
	return failed;
}

/* One communicator, as a one-rank job makes it. */
static int init_comm(void)
{
	ncclUniqueId id;
	ncclResult_t rc;

	if ((rc = ncclGetUniqueId(&id)) != ncclSuccess) {
		fprintf(stderr, "ncclGetUniqueId: %d\n", (int)rc);
		return 1;
	}
	if ((rc = ncclCommInitRank(&comm, 1, id, 0)) != ncclSuccess || !comm) {
		fprintf(stderr, "ncclCommInitRank: %d\n", (int)rc);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4 || strcmp(argv[1], "ncclAllReduce") != 0) {
		fprintf(stderr, "usage: %s ncclAllReduce CALLS WARMUP\n", argv[0]);
		return 2;
	}
	return bench_loop(argv[1], argv[2], argv[3], init_comm, calls_all_reduce);
}
