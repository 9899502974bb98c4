// A CUDA client built by NVIDIA's nvcc 12.4 at test time
// (internal/testutil.BuildNVCC), never committed. The build flags choose
// what it exercises: -cudart shared or static (nvcc's default),
// --default-stream per-thread (_ptds/_ptsz entry points), and the launch
// sequence (nvcc 12.4 passes -D__NV_LEGACY_LAUNCH: cudaLaunchKernel;
// -Xcompiler -U__NV_LEGACY_LAUNCH: __cudaGetKernel + __cudaLaunchKernel).
// Protocol: cudaGetDeviceCount (not probed), "ready <pid>"; "go" -> ITERS iterations of cudaMalloc,
// cudaMemcpy (256 bytes to the device), a <<<2, 64>>> launch of nvcc_nop,
// cudaDeviceSynchronize, cudaFree -> one JSON line: every call by function
// name and return code, and the launch attempts. "run" instead of "go":
// prints "running" and makes iterations until it has made at least ITERS
// and read "stop" (or EOF), so that a test's adversary (stalls), not the
// clock, decides how many; the JSON line says how many it made. Without a
// GPU every call returns 100 (NVIDIA's driver library found) or 35 (none).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <unistd.h>

__global__ void nvcc_nop(int *p) {
	if (p)
		*p = 1;
}

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#define PT(name, suffix) name suffix
#else
#define PT(name, suffix) name
#endif
#ifdef __NV_LEGACY_LAUNCH
#define LAUNCH PT("cudaLaunchKernel", "_ptsz")
#else
#define LAUNCH PT("__cudaLaunchKernel", "_ptsz")
#endif

// tally counts one function's calls by return code (few distinct codes).
struct tally {
	const char *name;
	int rc[4];
	unsigned long n[4];
	int used;
};

static void note(struct tally *t, int rc) {
	for (int i = 0; i < t->used; i++)
		if (t->rc[i] == rc) {
			t->n[i]++;
			return;
		}
	if (t->used == 4) {
		fprintf(stderr, "nvcc client: too many return codes\n");
		exit(1);
	}
	t->rc[t->used] = rc;
	t->n[t->used++] = 1;
}

static void print(const struct tally *t, const char *sep) {
	printf("%s\"%s\":{", sep, t->name);
	for (int i = 0; i < t->used; i++)
		printf("%s\"%d\":%lu", i ? "," : "", t->rc[i], t->n[i]);
	printf("}");
}

// stop_read reports whether "stop" (or EOF) has come on stdin while
// running. stdio holds nothing unread then: the test writes "stop" only
// after "running".
static bool stop_read() {
	struct pollfd p = {0, POLLIN, 0};
	char line[64];
	if (poll(&p, 1, 0) <= 0)
		return false;
	if (fgets(line, sizeof(line), stdin) && strncmp(line, "stop", 4)) {
		fprintf(stderr, "nvcc client: running: want \"stop\"\n");
		exit(1);
	}
	return true;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: client ITERS\n");
		return 2;
	}
	long iters = atol(argv[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	// Not probed: makes the runtime load the driver library before "ready"
	// (it dlopens it at its first call), so that a static runtime, which
	// maps no libcudart.so, is found and probed before the counted calls.
	int devices = 0;
	(void)cudaGetDeviceCount(&devices);
	printf("ready %d\n", (int)getpid());
	char line[64];
	if (!fgets(line, sizeof(line), stdin) || (strncmp(line, "go", 2) && strncmp(line, "run", 3)))
		return 1;
	bool stopped = line[0] == 'g';
	if (!stopped)
		printf("running\n");
	struct tally mal = {"cudaMalloc"}, cpy = {PT("cudaMemcpy", "_ptds")}, launch = {LAUNCH},
		     sync = {"cudaDeviceSynchronize"}, fre = {"cudaFree"};
	static char host[256];
	long launches = 0;
	for (long i = 0; i < iters || !stopped; i++) {
		if (!stopped && i % 16 == 0)
			stopped = stop_read();
		int *d = NULL;
		note(&mal, cudaMalloc(&d, sizeof(host)));
		note(&cpy, cudaMemcpy(d, host, sizeof(host), cudaMemcpyHostToDevice));
		nvcc_nop<<<2, 64>>>(d);
		launches++;
		// The stub discards the launch's return code; it is the last error.
		note(&launch, cudaGetLastError());
		note(&sync, cudaDeviceSynchronize());
		note(&fre, cudaFree(d));
	}
	printf("{\"calls\":{");
	print(&mal, "");
	print(&cpy, ",");
	print(&launch, ",");
	print(&sync, ",");
	print(&fre, ",");
	printf("},\"launches\":%ld,\"launch_symbol\":\"%s\"}\n", launches, LAUNCH);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
