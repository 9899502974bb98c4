/* A hostile tenant's libcudart.so.12 (issue 17 item 3): the tenant controls
 * its own library, so its functions return whatever code it likes. It
 * exports only what the hostile workload calls (profi attaches the
 * functions present, as with any partial runtime): copies, launches,
 * allocations and captures with no effect; each copy returns the code last
 * set with hostile_result, each allocation hands out the next fake device
 * pointer, each cudaStreamEndCapture the next fake graph handle (issue 30),
 * and cudaSetDevice accepts any ordinal (issue 47).
 *
 * Built with the stub flags (internal/testutil/build.go), SONAME
 * libcudart.so.12, so profi attaches it as a CUDA runtime. */
#include <stddef.h>
#include <stdint.h>

typedef struct {
	unsigned x, y, z;
} hostile_dim3;

static volatile int result;
static volatile uintptr_t next_ptr = 0x700000000000;

void hostile_result(int rc);
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
int cudaLaunchKernel(const void *fn, hostile_dim3 grid, hostile_dim3 block, void **args,
		     size_t shmem, void *stream);
int cudaMalloc(void **p, size_t size);
int cudaStreamBeginCapture(void *stream, int mode);
int cudaStreamBeginCaptureToGraph(void *stream, void *graph, const void *deps, const void *edges,
				  size_t n, int mode);
int cudaStreamEndCapture(void *stream, void **graph);
int cudaSetDevice(int device);

static volatile uintptr_t next_graph = 0x500000000000;

void hostile_result(int rc) { result = rc; }

int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
	(void)dst, (void)src, (void)n, (void)kind, (void)stream;
	return result;
}

int cudaLaunchKernel(const void *fn, hostile_dim3 grid, hostile_dim3 block, void **args,
		     size_t shmem, void *stream)
{
	(void)fn, (void)grid, (void)block, (void)args, (void)shmem, (void)stream;
	return 0;
}

int cudaMalloc(void **p, size_t size)
{
	(void)size;
	*p = (void *)next_ptr;
	next_ptr += 0x1000;
	return 0;
}

int cudaStreamBeginCapture(void *stream, int mode)
{
	(void)stream, (void)mode;
	return 0;
}

int cudaStreamBeginCaptureToGraph(void *stream, void *graph, const void *deps, const void *edges,
				  size_t n, int mode)
{
	(void)stream, (void)graph, (void)deps, (void)edges, (void)n, (void)mode;
	return 0;
}

int cudaStreamEndCapture(void *stream, void **graph)
{
	(void)stream;
	*graph = (void *)next_graph;
	next_graph += 0x10;
	return 0;
}

int cudaSetDevice(int device)
{
	(void)device;
	return 0;
}
