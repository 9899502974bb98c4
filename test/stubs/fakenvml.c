// A fake libnvidia-ml.so.1 for the e2e tests: the NVML entry points the
// agent calls through go-nvml (dlopen, lazy binding), with NVIDIA's own
// declarations and struct layouts from nvml.h (the copy go-nvml ships in the
// Go module cache, included at build time, never copied here). Its answers
// come from the scenario file named by $PROFI_FAKE_NVML_SCENARIO, read again
// whenever the file changes (a test writes it with rename), so a test can
// name the PIDs of workloads it started after the agent.
//
// Scenario lines (fields separated by blanks, '#' starts a comment):
//
//   driver VERSION
//   gpu UUID BUSID NAME [mig] [procutil=ok|unsupported] [gpm=ok|unsupported|inuse]
//   mig UUID GPU_INSTANCE_ID [procutil=ok|unsupported] [gpm=ok|unsupported|inuse]
//                                    (a MIG device of the gpu line before it)
//   sample UUID PID SM MEM ENC DEC [TS [again]]
//                                    (per-process utilization, percent: each
//                                    nvmlDeviceGetProcessUtilization call
//                                    answers one sample per line, stamped
//                                    with the current time; with TS (µs),
//                                    stamped TS and answered only while TS
//                                    is newer than lastSeenTimeStamp, or
//                                    always with "again", as a driver that
//                                    returns an old sample again)
//   proc UUID PID BYTES              (a running compute process)
//   gpmval UUID METRIC_ID VALUE      (nvmlGpmMetricsGet's answer for METRIC_ID)
//   xid GPU_UUID CODE ID             (an XID critical error event, delivered
//                                    once per ID; each delivered ID is
//                                    appended to the scenario's path plus
//                                    ".delivered", so that a test knows
//                                    which poll drained it)
//
// Functions profi calls that are absent here (temperature, power, ...) make
// go-nvml's LookupSymbol fail, which profi reports as not supported.
#define _GNU_SOURCE
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

#define MAX_DEVS 32
#define MAX_ROWS 256
#define MAX_SEEN 1024

enum cap { CAP_OK, CAP_UNSUPPORTED, CAP_INUSE };

struct nvmlDevice_st {
	char uuid[96];
	char busid[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
	char name[96];
	int parent; // index of the parent GPU for a MIG device, -1 for a GPU
	unsigned int gi;
	int mig; // MIG mode on (GPUs)
	enum cap procutil, gpm;
};

struct sample {
	int dev;
	unsigned int pid, sm, mem, enc, dec;
	unsigned long long ts; // 0: the current time
	int again;	       // answered whatever lastSeenTimeStamp says
};
struct proc {
	int dev;
	unsigned int pid;
	unsigned long long bytes;
};
struct gpmval {
	int dev;
	unsigned int id;
	double value;
};
struct xid {
	int dev;
	unsigned long long code, id;
};

static struct nvmlDevice_st devs[MAX_DEVS];
static int ndevs;
static char driver[80] = "580.65.06";
static struct sample samples[MAX_ROWS];
static int nsamples;
static struct proc procs[MAX_ROWS];
static int nprocs;
static struct gpmval gpmvals[MAX_ROWS];
static int ngpmvals;
static struct xid xids[MAX_ROWS];
static int nxids;
static unsigned long long delivered[MAX_SEEN]; // xid ids already delivered
static int ndelivered;
static struct stat loaded;

static int find_dev(const char *uuid)
{
	for (int i = 0; i < ndevs; i++)
		if (!strcmp(devs[i].uuid, uuid))
			return i;
	return -1;
}

static enum cap parse_cap(const char *tok, const char *key, enum cap dflt)
{
	size_t n = strlen(key);
	if (strncmp(tok, key, n) || tok[n] != '=')
		return dflt;
	tok += n + 1;
	if (!strcmp(tok, "unsupported"))
		return CAP_UNSUPPORTED;
	if (!strcmp(tok, "inuse"))
		return CAP_INUSE;
	return CAP_OK;
}

// load reads the scenario again if the file changed. Device handles stay
// where they are: a test keeps its devices and changes the rest.
static int load(void)
{
	const char *path = getenv("PROFI_FAKE_NVML_SCENARIO");
	struct stat st;
	if (!path || stat(path, &st))
		return -1;
	if (st.st_ino == loaded.st_ino && st.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec &&
	    st.st_mtim.tv_sec == loaded.st_mtim.tv_sec && st.st_size == loaded.st_size)
		return 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	loaded = st;
	ndevs = nsamples = nprocs = ngpmvals = nxids = 0;
	char line[512];
	int gpu = -1;
	while (fgets(line, sizeof line, f)) {
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		char *tok[12];
		int n = 0;
		for (char *s = strtok(line, " \t\n"); s && n < 12; s = strtok(NULL, " \t\n"))
			tok[n++] = s;
		if (n == 0)
			continue;
		if (!strcmp(tok[0], "driver") && n == 2) {
			snprintf(driver, sizeof driver, "%s", tok[1]);
		} else if ((!strcmp(tok[0], "gpu") && n >= 4) || (!strcmp(tok[0], "mig") && n >= 3 && gpu >= 0)) {
			if (ndevs == MAX_DEVS)
				continue;
			struct nvmlDevice_st *d = &devs[ndevs];
			memset(d, 0, sizeof *d);
			snprintf(d->uuid, sizeof d->uuid, "%s", tok[1]);
			int first = 4;
			if (tok[0][0] == 'g') {
				snprintf(d->busid, sizeof d->busid, "%s", tok[2]);
				snprintf(d->name, sizeof d->name, "%s", tok[3]);
				d->parent = -1;
				gpu = ndevs;
			} else {
				d->parent = gpu;
				d->gi = (unsigned int)strtoul(tok[2], NULL, 10);
				memcpy(d->busid, devs[gpu].busid, sizeof d->busid);
				memcpy(d->name, devs[gpu].name, sizeof d->name);
				first = 3;
			}
			for (int i = first; i < n; i++) {
				if (!strcmp(tok[i], "mig"))
					d->mig = 1;
				d->procutil = parse_cap(tok[i], "procutil", d->procutil);
				d->gpm = parse_cap(tok[i], "gpm", d->gpm);
			}
			ndevs++;
		} else if (!strcmp(tok[0], "sample") && n >= 7 && n <= 9 && nsamples < MAX_ROWS) {
			struct sample *s = &samples[nsamples];
			s->ts = n >= 8 ? strtoull(tok[7], NULL, 10) : 0;
			s->again = n == 9 && !strcmp(tok[8], "again");
			s->dev = find_dev(tok[1]);
			s->pid = strtoul(tok[2], NULL, 10);
			s->sm = strtoul(tok[3], NULL, 10);
			s->mem = strtoul(tok[4], NULL, 10);
			s->enc = strtoul(tok[5], NULL, 10);
			s->dec = strtoul(tok[6], NULL, 10);
			nsamples += s->dev >= 0;
		} else if (!strcmp(tok[0], "proc") && n == 4 && nprocs < MAX_ROWS) {
			struct proc *p = &procs[nprocs];
			p->dev = find_dev(tok[1]);
			p->pid = strtoul(tok[2], NULL, 10);
			p->bytes = strtoull(tok[3], NULL, 10);
			nprocs += p->dev >= 0;
		} else if (!strcmp(tok[0], "gpmval") && n == 4 && ngpmvals < MAX_ROWS) {
			struct gpmval *g = &gpmvals[ngpmvals];
			g->dev = find_dev(tok[1]);
			g->id = strtoul(tok[2], NULL, 10);
			g->value = strtod(tok[3], NULL);
			ngpmvals += g->dev >= 0;
		} else if (!strcmp(tok[0], "xid") && n == 4 && nxids < MAX_ROWS) {
			struct xid *x = &xids[nxids];
			x->dev = find_dev(tok[1]);
			x->code = strtoull(tok[2], NULL, 10);
			x->id = strtoull(tok[3], NULL, 10);
			nxids += x->dev >= 0;
		}
	}
	fclose(f);
	return 0;
}

static int gpus(void)
{
	int n = 0;
	for (int i = 0; i < ndevs; i++)
		n += devs[i].parent < 0;
	return n;
}

static int valid(struct nvmlDevice_st *d)
{
	return d >= devs && d < devs + ndevs;
}

nvmlReturn_t nvmlInit_v2(void)
{
	return load() ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
	static char buf[48];
	snprintf(buf, sizeof buf, "fake NVML error %d", (int)r);
	return buf;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	snprintf(version, length, "%s", driver);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	*count = (unsigned int)gpus();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	for (int i = 0, g = 0; i < ndevs; i++) {
		if (devs[i].parent >= 0)
			continue;
		if ((unsigned int)g++ == index) {
			device->handle = &devs[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dv, char *uuid, unsigned int length)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(uuid, length, "%s", d->uuid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dv, char *name, unsigned int length)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(name, length, "%s", d->name);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dv, unsigned int *minor)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || d->parent >= 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	*minor = 0;
	for (int i = 0; &devs[i] != d; i++)
		*minor += devs[i].parent < 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dv, nvmlPciInfo_t *pci)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof *pci);
	snprintf(pci->busId, sizeof pci->busId, "%s", d->busid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dv, unsigned int *current, unsigned int *pending)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || d->parent >= 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	*current = *pending = d->mig ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dv, unsigned int *count)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = 7;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dv, unsigned int index, nvmlDevice_t *mig)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	int parent = (int)(d - devs);
	for (int i = 0, m = 0; i < ndevs; i++) {
		if (devs[i].parent != parent)
			continue;
		if ((unsigned int)m++ == index) {
			mig->handle = &devs[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dv, unsigned int *id)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || d->parent < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	*id = d->gi;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dv, unsigned int *count, nvmlProcessInfo_t *infos)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || d->parent >= 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	load();
	unsigned int n = 0;
	for (int i = 0; i < nprocs; i++) {
		struct nvmlDevice_st *p = &devs[procs[i].dev];
		if (p != d && !(p->parent >= 0 && &devs[p->parent] == d))
			continue;
		if (n < *count) {
			infos[n].pid = procs[i].pid;
			infos[n].usedGpuMemory = procs[i].bytes;
			infos[n].gpuInstanceId = p->parent >= 0 ? p->gi : 0xFFFFFFFFu;
			infos[n].computeInstanceId = p->parent >= 0 ? 0 : 0xFFFFFFFFu;
		}
		n++;
	}
	nvmlReturn_t r = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
	*count = n;
	return r;
}

// The unversioned entry point (the v1 struct): go-nvml calls _v3 when it
// exists, but profi checks that the library exports this name, as every
// driver does.
#undef nvmlDeviceGetComputeRunningProcesses
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dv, unsigned int *count, nvmlProcessInfo_v1_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dv, unsigned int *count, nvmlProcessInfo_v1_t *infos)
{
	(void)dv, (void)count, (void)infos;
	return NVML_ERROR_NOT_SUPPORTED;
}

static unsigned long long now_us(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (unsigned long long)tv.tv_sec * 1000000ull + (unsigned long long)tv.tv_usec;
}

// nvmlDeviceGetProcessUtilization as NVIDIA documents it: utilization NULL
// asks for the count (NVML_ERROR_INSUFFICIENT_SIZE); only samples newer
// than lastSeenTimeStamp are returned; none is NVML_ERROR_NOT_FOUND. A GPU
// in MIG mode has none (NVML_ERROR_NOT_SUPPORTED); its MIG devices answer
// as their line says.
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dv, nvmlProcessUtilizationSample_t *utilization,
					     unsigned int *count, unsigned long long lastSeenTimeStamp)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	load();
	if (d->procutil != CAP_OK || (d->parent < 0 && d->mig))
		return NVML_ERROR_NOT_SUPPORTED;
	unsigned long long now = now_us();
	unsigned int n = 0;
	for (int i = 0; i < nsamples; i++) {
		if (&devs[samples[i].dev] != d)
			continue;
		unsigned long long ts = samples[i].ts ? samples[i].ts : now;
		if (ts <= lastSeenTimeStamp && !samples[i].again)
			continue;
		if (utilization && n < *count) {
			nvmlProcessUtilizationSample_t *u = &utilization[n];
			u->pid = samples[i].pid;
			u->timeStamp = ts;
			u->smUtil = samples[i].sm;
			u->memUtil = samples[i].mem;
			u->encUtil = samples[i].enc;
			u->decUtil = samples[i].dec;
		}
		n++;
	}
	if (n == 0)
		return NVML_ERROR_NOT_FOUND;
	if (!utilization || n > *count) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = n;
	return NVML_SUCCESS;
}

// GPM. A sample remembers the device (or MIG instance) it was taken on;
// nvmlGpmMetricsGet answers the scenario's values for that device, and
// NVML_ERROR_NOT_SUPPORTED per metric it lacks.
struct nvmlGpmSample_st {
	int dev;
	unsigned long long ts;
};

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dv, nvmlGpmSupport_t *support)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || support->version != NVML_GPM_SUPPORT_VERSION)
		return NVML_ERROR_INVALID_ARGUMENT;
	load();
	support->isSupportedDevice = d->gpm != CAP_UNSUPPORTED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s)
{
	s->handle = calloc(1, sizeof(struct nvmlGpmSample_st));
	if (!s->handle)
		return NVML_ERROR_MEMORY;
	s->handle->dev = -1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s)
{
	free(s.handle);
	return NVML_SUCCESS;
}

static nvmlReturn_t take(int dev, nvmlGpmSample_t s)
{
	load();
	if (devs[dev].gpm == CAP_UNSUPPORTED)
		return NVML_ERROR_NOT_SUPPORTED;
	if (devs[dev].gpm == CAP_INUSE) // the profiling counters are held (DCGM)
		return NVML_ERROR_IN_USE;
	s.handle->dev = dev;
	s.handle->ts = now_us();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dv, nvmlGpmSample_t s)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || !s.handle)
		return NVML_ERROR_INVALID_ARGUMENT;
	return take((int)(d - devs), s);
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t dv, unsigned int gpuInstanceId, nvmlGpmSample_t s)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || !s.handle)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < ndevs; i++)
		if (devs[i].parent == (int)(d - devs) && devs[i].gi == gpuInstanceId)
			return take(i, s);
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m)
{
	if (m->version != NVML_GPM_METRICS_GET_VERSION || m->numMetrics > NVML_GPM_METRIC_MAX ||
	    !m->sample1.handle || !m->sample2.handle || m->sample1.handle->dev < 0 ||
	    m->sample1.handle->dev != m->sample2.handle->dev)
		return NVML_ERROR_INVALID_ARGUMENT;
	int dev = m->sample2.handle->dev;
	for (unsigned int i = 0; i < m->numMetrics; i++) {
		m->metrics[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
		m->metrics[i].value = 0;
		for (int j = 0; j < ngpmvals; j++) {
			if (gpmvals[j].dev == dev && gpmvals[j].id == m->metrics[i].metricId) {
				m->metrics[i].nvmlReturn = NVML_SUCCESS;
				m->metrics[i].value = gpmvals[j].value;
			}
		}
	}
	return NVML_SUCCESS;
}

// Events: one set, XID critical errors only.
struct nvmlEventSet_st {
	int registered[MAX_DEVS];
};

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	set->handle = calloc(1, sizeof(struct nvmlEventSet_st));
	return set->handle ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	free(set.handle);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dv, unsigned long long *types)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d))
		return NVML_ERROR_INVALID_ARGUMENT;
	*types = nvmlEventTypeXidCriticalError;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dv, unsigned long long types, nvmlEventSet_t set)
{
	struct nvmlDevice_st *d = dv.handle;
	if (!valid(d) || types != nvmlEventTypeXidCriticalError)
		return NVML_ERROR_INVALID_ARGUMENT;
	set.handle->registered[d - devs] = 1;
	return NVML_SUCCESS;
}

// note_delivery appends a delivered event's ID to the scenario's
// ".delivered" file.
static void note_delivery(unsigned long long id)
{
	char path[4096];
	const char *scenario = getenv("PROFI_FAKE_NVML_SCENARIO");
	if (!scenario || snprintf(path, sizeof path, "%s.delivered", scenario) >= (int)sizeof path)
		return;
	FILE *f = fopen(path, "a");
	if (!f)
		return;
	fprintf(f, "%llu\n", id);
	fclose(f);
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	(void)timeoutms;
	load();
	for (int i = 0; i < nxids; i++) {
		int seen = 0;
		for (int j = 0; j < ndelivered; j++)
			seen |= delivered[j] == xids[i].id;
		if (seen || !set.handle->registered[xids[i].dev] || ndelivered == MAX_SEEN)
			continue;
		delivered[ndelivered++] = xids[i].id;
		note_delivery(xids[i].id);
		memset(data, 0, sizeof *data);
		data->device.handle = &devs[xids[i].dev];
		data->eventType = nvmlEventTypeXidCriticalError;
		data->eventData = xids[i].code;
		data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
		return NVML_SUCCESS;
	}
	return NVML_ERROR_TIMEOUT;
}
