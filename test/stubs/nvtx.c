/* Stub NVTX v2 library: the real exported C API names and ABI of
 * libnvToolsExt.so.1 (built a second time as libnvtx3interop.so.1, which
 * exports the same functions), behaving like NVTX with a tool attached:
 * ranges nest per thread and per domain, and push and pop return levels.
 * The workload computes its phase ground truth itself; the stub only has to
 * take the calls where probes see them.
 *
 * Built only with the fixed flags in internal/testutil/build.go, like the
 * CUDA stubs: every exported function starts with "push %rbp". */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nvtx_stub.h"

#define EXPORT __attribute__((noinline, visibility("default")))
#define INTERNAL static __attribute__((noinline))

/* The call is never in tail position, so every export starts with
 * "push %rbp" (see WRAP in cudart.c); WRAP_VOID for void functions. */
#define WRAP(type, call)              \
	do {                          \
		type r_ = (call);     \
		sink = (uintptr_t)r_; \
		return r_;            \
	} while (0)
#define WRAP_VOID(call) (sink = (call))

static volatile uintptr_t sink;

INTERNAL uintptr_t do_note(uintptr_t v)
{
	return v ^ 1;
}

/* Domains: index 0 is the default domain (handle NULL); created ones are
 * 1..MAX_DOMAINS, never freed, so a handle stays valid for the process. */
#define MAX_DOMAINS 64
struct nvtxDomainRegistration_st {
	int idx;
	char name[64];
};
static struct nvtxDomainRegistration_st domains[MAX_DOMAINS + 1];
static int ndomains;
static pthread_mutex_t domains_mu = PTHREAD_MUTEX_INITIALIZER;

/* Registered strings: copied, never freed. */
struct nvtxStringRegistration_st {
	nvtxDomainHandle_t domain;
	char *s;
};

static _Thread_local int depth[MAX_DOMAINS + 1];

/* The domain's index, or -1 for a handle this library did not hand out. */
static int domain_index(nvtxDomainHandle_t d)
{
	if (!d)
		return 0;
	if (d < &domains[1] || d > &domains[MAX_DOMAINS])
		return -1;
	return d->idx;
}

INTERNAL int do_push(int dom, uintptr_t message)
{
	sink = message;
	if (dom < 0)
		return -1;
	return depth[dom]++;
}

INTERNAL int do_pop(int dom)
{
	if (dom < 0 || depth[dom] == 0)
		return -1;
	return --depth[dom];
}

/* An attribute struct shorter than v2's, or of an unknown message type, is
 * rejected. */
INTERNAL int do_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
	if (!a || a->size < NVTX_EVENT_ATTRIB_STRUCT_SIZE ||
	    a->messageType < NVTX_MESSAGE_UNKNOWN || a->messageType > NVTX_MESSAGE_TYPE_REGISTERED)
		return -1;
	return do_push(domain_index(d), (uintptr_t)a->message.ascii);
}

/* The same name gives the same handle, as tools do. */
INTERNAL nvtxDomainHandle_t do_domain_create(const char *name)
{
	nvtxDomainHandle_t d = NULL;
	if (!name)
		return NULL;
	pthread_mutex_lock(&domains_mu);
	for (int i = 1; i <= ndomains; i++) {
		if (!strncmp(domains[i].name, name, sizeof(domains[i].name) - 1)) {
			d = &domains[i];
			goto out;
		}
	}
	if (ndomains < MAX_DOMAINS) {
		d = &domains[++ndomains];
		d->idx = ndomains;
		strncpy(d->name, name, sizeof(d->name) - 1);
	}
out:
	pthread_mutex_unlock(&domains_mu);
	return d;
}

INTERNAL nvtxStringHandle_t do_register_string(nvtxDomainHandle_t d, const char *s)
{
	struct nvtxStringRegistration_st *r;
	if (!s || domain_index(d) < 0 || !(r = malloc(sizeof(*r))))
		return NULL;
	r->domain = d;
	if (!(r->s = strdup(s))) {
		free(r);
		return NULL;
	}
	return r;
}

EXPORT void nvtxInitialize(const void *reserved)
{
	WRAP_VOID(do_note((uintptr_t)reserved));
}

EXPORT void nvtxMarkA(const char *message)
{
	WRAP_VOID(do_note((uintptr_t)message));
}

EXPORT int nvtxRangePushA(const char *message)
{
	WRAP(int, do_push(0, (uintptr_t)message));
}

EXPORT int nvtxRangePushW(const wchar_t *message)
{
	WRAP(int, do_push(0, (uintptr_t)message));
}

EXPORT int nvtxRangePushEx(const nvtxEventAttributes_t *eventAttrib)
{
	WRAP(int, do_push_ex(NULL, eventAttrib));
}

EXPORT int nvtxRangePop(void)
{
	WRAP(int, do_pop(0));
}

EXPORT nvtxDomainHandle_t nvtxDomainCreateA(const char *name)
{
	WRAP(nvtxDomainHandle_t, do_domain_create(name));
}

/* Domains live as long as the process: destroying is a no-op. */
EXPORT void nvtxDomainDestroy(nvtxDomainHandle_t domain)
{
	WRAP_VOID(do_note((uintptr_t)domain));
}

EXPORT nvtxStringHandle_t nvtxDomainRegisterStringA(nvtxDomainHandle_t domain, const char *string)
{
	WRAP(nvtxStringHandle_t, do_register_string(domain, string));
}

EXPORT int nvtxDomainRangePushEx(nvtxDomainHandle_t domain,
				 const nvtxEventAttributes_t *eventAttrib)
{
	WRAP(int, do_push_ex(domain, eventAttrib));
}

EXPORT int nvtxDomainRangePop(nvtxDomainHandle_t domain)
{
	WRAP(int, do_pop(domain_index(domain)));
}
