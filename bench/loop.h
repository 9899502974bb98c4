/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The protocol both benchmark loops share (bench/loop.c, bench/nccl_loop.c):
 * parse CALLS and WARMUP, print "ready pid=PID", wait for the go-ahead line
 * on stdin (the benchmark attaches its probes meanwhile), prepare (if given),
 * run WARMUP untimed then CALLS timed calls, and print
 *   pid=PID calls=CALLS warmup=WARMUP elapsed_ns=NS
 * Exits 1 if any call fails, 2 on bad arguments, 3 if stdin ends before
 * the go-ahead.
 */
#ifndef PROFI_BENCH_LOOP_H
#define PROFI_BENCH_LOOP_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* run(n) makes n calls and returns how many failed; prepare returns 0 on success. */
static int bench_loop(const char *name, const char *calls_arg, const char *warmup_arg,
		      int (*prepare)(void), long (*run)(long))
{
	long calls = atol(calls_arg), warmup = atol(warmup_arg), failed;
	long long t0, t1;
	char line[16];

	if (calls <= 0 || warmup < 0) {
		fprintf(stderr, "CALLS must be > 0 and WARMUP >= 0\n");
		return 2;
	}
	printf("ready pid=%d\n", (int)getpid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "stdin closed before the go-ahead\n");
		return 3;
	}
	if (prepare && prepare())
		return 1;
	failed = run(warmup);
	t0 = now_ns();
	failed += run(calls);
	t1 = now_ns();
	if (failed) {
		fprintf(stderr, "%ld calls of %s failed\n", failed, name);
		return 1;
	}
	printf("pid=%d calls=%ld warmup=%ld elapsed_ns=%lld\n", (int)getpid(), calls, warmup, t1 - t0);
	return 0;
}

#endif
