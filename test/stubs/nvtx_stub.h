/* Minimal NVTX v2 C API types and prototypes shared by the stub NVTX
 * library (nvtx.c, built as libnvToolsExt.so.1 and libnvtx3interop.so.1)
 * and the workload. Layouts match the real nvToolsExt.h on x86-64 SysV, so
 * probes read the same registers and struct offsets: in particular
 * nvtxEventAttributes_v2's messageType (offset 32) and message (offset 40). */
#ifndef PROFI_NVTX_STUB_H
#define PROFI_NVTX_STUB_H

#include <stddef.h>
#include <stdint.h>
#include <wchar.h>

#define NVTX_VERSION 2

typedef struct nvtxDomainRegistration_st *nvtxDomainHandle_t;
typedef struct nvtxStringRegistration_st *nvtxStringHandle_t;

typedef enum nvtxMessageType_t {
	NVTX_MESSAGE_UNKNOWN = 0,
	NVTX_MESSAGE_TYPE_ASCII = 1,
	NVTX_MESSAGE_TYPE_UNICODE = 2, /* wchar_t: UTF-32 on Linux */
	NVTX_MESSAGE_TYPE_REGISTERED = 3,
} nvtxMessageType_t;

typedef enum nvtxColorType_t {
	NVTX_COLOR_UNKNOWN = 0,
	NVTX_COLOR_ARGB = 1,
} nvtxColorType_t;

typedef enum nvtxPayloadType_t {
	NVTX_PAYLOAD_UNKNOWN = 0,
	NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 = 1,
	NVTX_PAYLOAD_TYPE_INT64 = 2,
	NVTX_PAYLOAD_TYPE_DOUBLE = 3,
	NVTX_PAYLOAD_TYPE_UNSIGNED_INT32 = 4,
	NVTX_PAYLOAD_TYPE_INT32 = 5,
	NVTX_PAYLOAD_TYPE_FLOAT = 6,
} nvtxPayloadType_t;

typedef union nvtxMessageValue_t {
	const char *ascii;
	const wchar_t *unicode;
	nvtxStringHandle_t registered;
} nvtxMessageValue_t;

typedef struct nvtxEventAttributes_v2 {
	uint16_t version;
	uint16_t size;
	uint32_t category;
	int32_t colorType;
	uint32_t color;
	int32_t payloadType;
	int32_t reserved0;
	union payload_t {
		uint64_t ullValue;
		int64_t llValue;
		double dValue;
		uint32_t uiValue;
		int32_t iValue;
		float fValue;
	} payload;
	int32_t messageType;
	nvtxMessageValue_t message;
} nvtxEventAttributes_v2;
typedef struct nvtxEventAttributes_v2 nvtxEventAttributes_t;

#define NVTX_EVENT_ATTRIB_STRUCT_SIZE ((uint16_t)(sizeof(nvtxEventAttributes_t)))

_Static_assert(sizeof(nvtxEventAttributes_t) == 48, "nvtxEventAttributes_v2 size");
_Static_assert(offsetof(nvtxEventAttributes_t, payload) == 24, "payload offset");
_Static_assert(offsetof(nvtxEventAttributes_t, messageType) == 32, "messageType offset");
_Static_assert(offsetof(nvtxEventAttributes_t, message) == 40, "message offset");
_Static_assert(sizeof(wchar_t) == 4, "wchar_t is UTF-32");

/* Range push functions return the 0-based nesting level of the range they
 * open, pops the level of the range they close; a negative value on error
 * (a pop with no open range). Levels are per thread and per domain; NULL is
 * the default domain, the one nvtxRangePush and nvtxRangePop use. */
void nvtxInitialize(const void *reserved);
void nvtxMarkA(const char *message);
int nvtxRangePushA(const char *message);
int nvtxRangePushW(const wchar_t *message);
int nvtxRangePushEx(const nvtxEventAttributes_t *eventAttrib);
int nvtxRangePop(void);
nvtxDomainHandle_t nvtxDomainCreateA(const char *name);
void nvtxDomainDestroy(nvtxDomainHandle_t domain);
nvtxStringHandle_t nvtxDomainRegisterStringA(nvtxDomainHandle_t domain, const char *string);
int nvtxDomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *eventAttrib);
int nvtxDomainRangePop(nvtxDomainHandle_t domain);

/* The X-macro the workload declares its dlsym'd pointers with: name,
 * return type, parameter list. */
#define PROFI_NVTX_FUNCS(X)                                                                        \
	X(nvtxRangePushA, int, (const char *message))                                              \
	X(nvtxRangePushW, int, (const wchar_t *message))                                           \
	X(nvtxRangePop, int, (void))                                                               \
	X(nvtxDomainCreateA, nvtxDomainHandle_t, (const char *name))                               \
	X(nvtxDomainRangePushEx, int,                                                              \
	  (nvtxDomainHandle_t domain, const nvtxEventAttributes_t *eventAttrib))                   \
	X(nvtxDomainRangePop, int, (nvtxDomainHandle_t domain))

#endif
