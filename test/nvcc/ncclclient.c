// A client of NVIDIA's NCCL 2.29 (Debian's libnccl.so.2, which needs glibc
// 2.38: run through trixie's dynamic loader), built at test time by the
// host's cc, never committed. It dlopens libnccl by path (no link against
// it: the host's glibc is older). Protocol: "ready <pid>"; "go" -> ITERS
// times: ncclGroupStart, ncclAllReduce of 1024 floats on a NULL
// communicator, ncclGroupEnd; then once ncclGetUniqueId and
// ncclCommInitRank(nranks 1, rank 0) -> one JSON line: calls by function and
// return code. Without a GPU: ncclCommInitRank returns 1 (unhandled CUDA
// error), the collective 4 (invalid argument), the rest 0.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
	char internal[128];
} ncclUniqueId;
typedef void *ncclComm_t;

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: ncclclient LIBNCCL ITERS\n");
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "ncclclient: %s\n", dlerror());
		return 1;
	}
	int (*group_start)(void) = (int (*)(void))dlsym(h, "ncclGroupStart");
	int (*group_end)(void) = (int (*)(void))dlsym(h, "ncclGroupEnd");
	int (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, void *) =
		(int (*)(const void *, void *, size_t, int, int, ncclComm_t, void *))dlsym(h, "ncclAllReduce");
	int (*get_id)(ncclUniqueId *) = (int (*)(ncclUniqueId *))dlsym(h, "ncclGetUniqueId");
	int (*init_rank)(ncclComm_t *, int, ncclUniqueId, int) =
		(int (*)(ncclComm_t *, int, ncclUniqueId, int))dlsym(h, "ncclCommInitRank");
	if (!group_start || !group_end || !all_reduce || !get_id || !init_rank) {
		fprintf(stderr, "ncclclient: missing symbol\n");
		return 1;
	}
	long iters = atol(argv[2]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %d\n", (int)getpid());
	char line[64];
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2))
		return 1;
	long gs[8] = {0}, ar[8] = {0}, ge[8] = {0};
	static float buf[1024];
	for (long i = 0; i < iters; i++) {
		gs[group_start() & 7]++;
		ar[all_reduce(buf, buf, 1024, 7 /* ncclFloat32 */, 0 /* ncclSum */, NULL, NULL) & 7]++;
		ge[group_end() & 7]++;
	}
	ncclUniqueId id;
	int rid = get_id(&id);
	ncclComm_t comm = NULL;
	int rinit = init_rank(&comm, 1, id, 0);
	printf("{\"calls\":{");
	const char *names[] = {"ncclGroupStart", "ncclAllReduce", "ncclGroupEnd"};
	long *t[] = {gs, ar, ge};
	for (int f = 0; f < 3; f++) {
		printf("%s\"%s\":{", f ? "," : "", names[f]);
		const char *sep = "";
		for (int rc = 0; rc < 8; rc++)
			if (t[f][rc]) {
				printf("%s\"%d\":%ld", sep, rc, t[f][rc]);
				sep = ",";
			}
		printf("}");
	}
	printf(",\"ncclGetUniqueId\":{\"%d\":1},\"ncclCommInitRank\":{\"%d\":1}}}\n", rid, rinit);
	while (fgets(line, sizeof(line), stdin))
		;
	return 0;
}
