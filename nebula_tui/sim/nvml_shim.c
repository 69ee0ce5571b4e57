/*
 * The simulated lab's NVML: a shared library named libnvidia-ml.so.1 that the real pynvml
 * loads on a simulated node (the lab puts its directory on the node's LD_LIBRARY_PATH).
 *
 * It answers the NVML calls the nodelet makes from the same state the emulated nvidia-smi
 * (fake_smi.py) reads, with the same formulas, so both paths agree:
 *   $NEBULA_SIM_DIR/nvml.tsv     the node's GPUs (written by the lab from node.json)
 *   $NEBULA_SIM_DIR/faults.tsv   per-GPU faults (written with faults.json)
 *   $NEBULA_SIM_DIR/nvml_events.tsv  "index<TAB>xid" lines: critical Xids for event sets
 *   $NEBULA_SIM_DIR/woken.tsv    "index<TAB>epoch-seconds": work through the simulated CUDA
 *                                driver (cuda_shim.c) ended; an idle card shows P0 a while
 *   /proc/<pid>/environ          processes on this node's GPUs (CUDA_VISIBLE_DEVICES)
 * The dynamic state is read again when it is older than REFRESH_NS (or
 * $NEBULA_SIM_NVML_REFRESH_MS), so one probe's dozens of calls cost one look at /proc.
 *
 * Built with -DSIM_OLD_DRIVER it lacks the calls drivers before R460/R510 lack
 * (remapped rows, clock-event reasons under their new name, max PCIe generation).
 * Build: cc -shared -fPIC -O2 -o libnvidia-ml.so.1 nvml_shim.c -lm -lpthread
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sim_faults.h"

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999
};

#define MAX_GPUS 16
#define MAX_PROCS 256
#define REFRESH_NS 200000000LL
#define WAKE_HOLD_S 20.0  /* fake_smi.WAKE_HOLD_S */
#define IDLE_MEMORY_MB 1
#define IDLE_SM_CLOCK 210
#define IDLE_MEM_CLOCK 405
#define DEFAULT_PROCESS_MB 1024
#define DEFAULT_PROCESS_UTIL 60.0
#define XID_CRITICAL 0x8ULL
#define REASON_IDLE 0x1ULL
#define REASON_HW_SLOWDOWN 0x8ULL
#define REASON_HW_THERMAL 0x40ULL

typedef struct {
    unsigned index;
    int parent;  /* a MIG instance: the slot of its GPU in gpus[]; a GPU: -1 */
    char uuid[96], name[96], pci[32];
    unsigned long long total_mb;
    double power_limit_w, idle_power_w, base_temp;
    unsigned max_sm, max_mem, base_sm, pcie_gen, pcie_width;
    int cc_major, cc_minor, has_fan, ecc, persistence;
    /* dynamic */
    unsigned long long used_mb;
    double util, temp, power;
    unsigned sm, mem_clock, fan;
    int pstate, lost, throttle, nprocs;
    int util_na;  /* a fault "util None": the card reports no utilisation (NOT_SUPPORTED) */
    long long ecc_uncorrected;
    unsigned procs[MAX_PROCS];
    unsigned long long proc_mb[MAX_PROCS];
} sim_gpu;

typedef struct {
    long offset;
    unsigned long long mask[MAX_GPUS];
} sim_events;

typedef struct {
    unsigned pid;
    sim_gpu *device;
    unsigned long long type, data;
    unsigned gi, ci;
} nvml_event_data;  /* nvmlEventData_t */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized = 0;
static char sim_dir[PATH_MAX - 64];  /* room for the file names after it */
static char sim_node[128];
static char driver[80] = "550.54.15";
static int cuda_version = 12040;
/* WSL2: the Windows driver (WDDM) does not give per-process memory: NVML says "not available" */
static int per_process_memory_na = 0;
static sim_gpu gpus[MAX_GPUS];
static unsigned gpu_count = 0;     /* the cards: gpus[0 .. gpu_count) */
static unsigned device_count = 0;  /* and their MIG instances after them */
static long long refreshed_at = 0;
static long long refresh_ns = REFRESH_NS;  /* $NEBULA_SIM_NVML_REFRESH_MS (bench/probe.py) */

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void copy(char *to, size_t size, const char *from) {
    snprintf(to, size, "%s", from);
}

static void path_of(char *out, size_t size, const char *file) {
    snprintf(out, size, "%s/%s", sim_dir, file);
}

/* --- the node's GPUs ------------------------------------------------------------------- */

static int load_gpus(void) {
    char path[PATH_MAX], line[1024];
    path_of(path, sizeof path, "nvml.tsv");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    gpu_count = device_count = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *fields[24];
        int n = 0;
        for (char *p = line; n < 24; n++) {
            fields[n] = p;
            char *tab = strchr(p, '\t');
            if (!tab) { n++; break; }
            *tab = 0;
            p = tab + 1;
        }
        if (n >= 4 && strcmp(fields[0], "driver") == 0) {
            copy(driver, sizeof driver, fields[1]);
            cuda_version = atoi(fields[3]);
            per_process_memory_na = n >= 6 && strcmp(fields[4], "wsl") == 0 && atoi(fields[5]) == 1;
        } else if (n >= 6 && strcmp(fields[0], "mig") == 0 && device_count < MAX_GPUS) {
            /* mig  parent-index  uuid  name  memory-MiB  slot */
            for (unsigned p = 0; p < gpu_count; p++) {
                if (gpus[p].index != (unsigned)atoi(fields[1])) continue;
                sim_gpu *m = &gpus[device_count++];
                *m = gpus[p];
                m->parent = (int)p;
                m->index = (unsigned)atoi(fields[5]);
                copy(m->uuid, sizeof m->uuid, fields[2]);
                copy(m->name, sizeof m->name, fields[3]);
                m->total_mb = strtoull(fields[4], NULL, 10);
            }
        } else if (n >= 18 && strcmp(fields[0], "gpu") == 0 && gpu_count < MAX_GPUS
                   && device_count == gpu_count) {  /* every card comes before any instance */
            sim_gpu *g = &gpus[gpu_count++];
            device_count = gpu_count;
            memset(g, 0, sizeof *g);
            g->parent = -1;
            g->index = (unsigned)atoi(fields[1]);
            copy(g->uuid, sizeof g->uuid, fields[2]);
            copy(g->name, sizeof g->name, fields[3]);
            copy(g->pci, sizeof g->pci, fields[4]);
            g->total_mb = strtoull(fields[5], NULL, 10);
            g->power_limit_w = atof(fields[6]);
            g->idle_power_w = atof(fields[7]);
            g->base_temp = atof(fields[8]);
            g->max_sm = (unsigned)atoi(fields[9]);
            g->max_mem = (unsigned)atoi(fields[10]);
            g->base_sm = (unsigned)atoi(fields[11]);
            g->pcie_gen = (unsigned)atoi(fields[12]);
            g->pcie_width = (unsigned)atoi(fields[13]);
            g->cc_major = atoi(fields[14]);
            g->cc_minor = atoi(fields[15]);
            g->has_fan = atoi(fields[16]);
            g->ecc = atoi(fields[17]);
            g->persistence = n > 18 ? atoi(fields[18]) : 0;
        }
    }
    fclose(f);
    if (device_count < gpu_count) device_count = gpu_count;
    return gpu_count > 0;
}

/* --- processes from /proc ---------------------------------------------------------------- */

#define TRACKED 5
static const char *tracked[TRACKED] = {"NEBULA_SIM_NODE=", "CUDA_VISIBLE_DEVICES=",
                                       "NEBULA_SIM_GPU_MEM=", "NEBULA_GPU_MEM_MB=",
                                       "NEBULA_SIM_GPU_UTIL="};

typedef struct {
    unsigned pid, ppid;
    char *vars[TRACKED];  /* values (NULL: absent) */
    char *sim_dir;
    char buffer[8192];
} proc_env;

static char *keep(proc_env *p, size_t *used, const char *value) {
    size_t len = strlen(value) + 1;
    if (*used + len > sizeof p->buffer) return NULL;
    char *at = p->buffer + *used;
    memcpy(at, value, len);
    *used += len;
    return at;
}

static unsigned parent_of(unsigned pid) {
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *end = strrchr(text, ')');  /* the command may hold spaces and parentheses */
    if (!end) return 0;
    char state;
    unsigned ppid = 0;
    if (sscanf(end + 1, " %c %u", &state, &ppid) != 2) return 0;
    return ppid;
}

static int read_env(unsigned pid, proc_env *out) {
    char path[64];
    static char data[65536];
    snprintf(path, sizeof path, "/proc/%u/environ", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(data, 1, sizeof data - 1, f);
    fclose(f);
    data[n] = 0;
    memset(out->vars, 0, sizeof out->vars);
    out->sim_dir = NULL;
    size_t used = 0;
    for (size_t i = 0; i < n; i += strlen(data + i) + 1) {
        const char *item = data + i;
        for (int t = 0; t < TRACKED; t++)
            if (strncmp(item, tracked[t], strlen(tracked[t])) == 0)
                out->vars[t] = keep(out, &used, item + strlen(tracked[t]));
        if (strncmp(item, "NEBULA_SIM_DIR=", 15) == 0) out->sim_dir = keep(out, &used, item + 15);
    }
    out->pid = pid;
    out->ppid = parent_of(pid);
    return out->vars[1] != NULL;  /* CUDA_VISIBLE_DEVICES */
}

static int on_this_node(const proc_env *p) {
    if (sim_dir[0] && p->sim_dir) {
        if (strcmp(p->sim_dir, sim_dir) == 0) return 1;  /* the usual case, without a stat */
        char a[PATH_MAX], b[PATH_MAX];
        if (!realpath(p->sim_dir, a) || !realpath(sim_dir, b)) return 0;
        return strcmp(a, b) == 0;
    }
    return p->vars[0] && strcmp(p->vars[0], sim_node) == 0;
}

static long long size_mb(const char *text) {
    if (!text || !*text) return -1;
    char *end;
    double value = strtod(text, &end);
    if (end == text) return -1;
    while (*end == ' ') end++;
    double scale = 1;
    switch (tolower((unsigned char)*end)) {
        case 'k': scale = 1.0 / 1024; end++; break;
        case 'm': end++; break;
        case 'g': scale = 1024; end++; break;
        case 't': scale = 1024.0 * 1024; end++; break;
    }
    if (tolower((unsigned char)*end) == 'i') end++;
    if (tolower((unsigned char)*end) == 'b') end++;
    if (*end) return -1;
    return (long long)(value * scale + 0.5);
}

/* CUDA_VISIBLE_DEVICES -> device slots (a card by index or GPU- UUID, a MIG instance by its
 * MIG- UUID); like CUDA, stop at the first unknown entry. */
static int visible(const char *value, int *slots) {
    int n = 0;
    char copy_of[1024];
    copy(copy_of, sizeof copy_of, value);
    for (char *entry = strtok(copy_of, ","); entry; entry = strtok(NULL, ",")) {
        while (*entry == ' ') entry++;
        int found = -1, matches = 0;
        for (unsigned g = 0; g < device_count; g++) {
            char number[16];
            snprintf(number, sizeof number, "%u", gpus[g].index);
            int card = gpus[g].parent < 0;
            if ((card && strcmp(entry, number) == 0) ||
                ((strncmp(entry, "GPU-", 4) == 0 || strncmp(entry, "MIG-", 4) == 0)
                 && strncmp(gpus[g].uuid, entry, strlen(entry)) == 0)) {
                found = (int)g;
                matches++;
            }
        }
        if (matches != 1) break;
        slots[n++] = found;
    }
    return n;
}

static int same_tracked(const proc_env *a, const proc_env *b) {
    for (int t = 0; t < TRACKED; t++) {
        if ((a->vars[t] == NULL) != (b->vars[t] == NULL)) return 0;
        if (a->vars[t] && strcmp(a->vars[t], b->vars[t]) != 0) return 0;
    }
    return 1;
}

static proc_env envs[MAX_PROCS];

static void scan_processes(void) {
    unsigned ancestors[64];
    int nancestors = 0;
    for (unsigned pid = (unsigned)getpid(); pid > 1 && nancestors < 64; pid = parent_of(pid))
        ancestors[nancestors++] = pid;
    int count = 0;
    DIR *proc = opendir("/proc");
    if (!proc) return;
    struct dirent *entry;
    while ((entry = readdir(proc)) && count < MAX_PROCS) {
        if (!isdigit((unsigned char)entry->d_name[0])) continue;
        unsigned pid = (unsigned)atoi(entry->d_name);
        int mine = 0;
        for (int a = 0; a < nancestors; a++) mine |= ancestors[a] == pid;
        if (mine) continue;
        if (read_env(pid, &envs[count]) && on_this_node(&envs[count])) count++;
    }
    closedir(proc);
    for (int i = 0; i < count; i++) {
        proc_env *p = &envs[i];
        int child = 0;  /* part of its parent's job: the tree counts once, at its root */
        for (int j = 0; j < count; j++)
            if (envs[j].pid == p->ppid && same_tracked(&envs[j], p)) child = 1;
        if (child) continue;
        int slots[MAX_GPUS];
        int n = visible(p->vars[1], slots);
        long long mb = size_mb(p->vars[2]);
        if (mb < 0) mb = size_mb(p->vars[3]);
        if (mb <= 0) mb = DEFAULT_PROCESS_MB;
        double util = p->vars[4] ? atof(p->vars[4]) : DEFAULT_PROCESS_UTIL;
        if (util < 0) util = 0;
        for (int s = 0; s < n; s++) {
            sim_gpu *g = &gpus[slots[s]];
            if (g->nprocs >= MAX_PROCS) continue;
            g->procs[g->nprocs] = p->pid;
            g->proc_mb[g->nprocs] = (unsigned long long)mb > g->total_mb ? g->total_mb : (unsigned long long)mb;
            g->nprocs++;
            g->used_mb += (unsigned long long)mb;
            g->util += util;
        }
    }
}

/* --- faults ----------------------------------------------------------------------------------- */

static void apply_fault(unsigned index, const char *key, const char *value) {
    for (unsigned g = 0; g < gpu_count; g++) {
        sim_gpu *gpu = &gpus[g];
        if (gpu->index != index) continue;
        int yes = strcmp(value, "true") == 0 || strcmp(value, "1") == 0;
        if (strcmp(key, "lost") == 0) gpu->lost = yes;
        else if (strcmp(key, "temp_c") == 0) gpu->temp = atof(value);
        else if (strcmp(key, "util") == 0 && strcmp(value, "None") == 0) gpu->util_na = 1;
        else if (strcmp(key, "util") == 0) gpu->util = atof(value);
        else if (strcmp(key, "sm_clock_mhz") == 0) gpu->sm = (unsigned)atoi(value);
        else if (strcmp(key, "ecc_uncorrected") == 0) gpu->ecc_uncorrected = atoll(value);
        else if (strcmp(key, "throttle") == 0) gpu->throttle = yes;
        else if (strcmp(key, "pstate") == 0 && value[0] == 'P') gpu->pstate = atoi(value + 1);
    }
}

static void apply_faults(void) {
    read_faults(sim_dir, apply_fault);
}

/* An idle card that did work through the simulated CUDA driver lately is in P0. */
static void apply_wakes(void) {
    char path[PATH_MAX], line[128];
    path_of(path, sizeof path, "woken.tsv");
    FILE *f = fopen(path, "r");
    if (!f) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    while (fgets(line, sizeof line, f)) {
        unsigned index;
        double when;
        if (sscanf(line, "%u\t%lf", &index, &when) != 2 || now - when >= WAKE_HOLD_S) continue;
        for (unsigned g = 0; g < gpu_count; g++)
            if (gpus[g].index == index && gpus[g].pstate == 8) gpus[g].pstate = 0;
    }
    fclose(f);
}

static long round_half_even(double x) {  /* Python's round(), so both emulators agree */
    double r = nearbyint(x);
    return (long)r;
}

static void refresh(void) {
    long long now = now_ns();
    if (refreshed_at && now - refreshed_at < refresh_ns) return;
    for (unsigned g = 0; g < device_count; g++) {
        sim_gpu *gpu = &gpus[g];
        gpu->nprocs = 0;
        gpu->used_mb = 0;
        gpu->util = 0;
        gpu->util_na = 0;
    }
    scan_processes();
    for (unsigned g = gpu_count; g < device_count; g++) {  /* a card holds its instances' work */
        sim_gpu *parent = &gpus[gpus[g].parent];
        parent->used_mb += gpus[g].used_mb;
        parent->util += gpus[g].util;
    }
    for (unsigned g = 0; g < device_count; g++) {
        sim_gpu *gpu = &gpus[g];
        int busy_any = gpu->nprocs > 0 || gpu->used_mb > 0;  /* a card busy through its instances */
        if (gpu->util > 100) gpu->util = 100;
        double busy = gpu->util / 100.0;
        gpu->used_mb = busy_any ? (gpu->used_mb > gpu->total_mb ? gpu->total_mb : gpu->used_mb)
                                : IDLE_MEMORY_MB;
        gpu->temp = (double)round_half_even(gpu->base_temp + gpu->util * 0.45);
        gpu->power = gpu->idle_power_w + busy * (gpu->power_limit_w - gpu->idle_power_w);
        gpu->sm = (unsigned)round_half_even(IDLE_SM_CLOCK + busy * (gpu->max_sm - IDLE_SM_CLOCK));
        gpu->mem_clock = busy_any ? gpu->max_mem : IDLE_MEM_CLOCK;
        gpu->fan = (unsigned)round_half_even(30 + gpu->util * 0.5);
        gpu->pstate = busy_any ? 2 : 8;
        gpu->lost = 0;
        gpu->throttle = 0;
        gpu->ecc_uncorrected = 0;
    }
    apply_wakes();
    apply_faults();
    refreshed_at = now_ns();  /* from the end: a slow scan on a loaded node is not redone at once */
}

/* --- the API ---------------------------------------------------------------------------------- */

#define DEVICE(handle) \
    sim_gpu *g = (sim_gpu *)(handle); \
    if (!initialized) return NVML_ERROR_UNINITIALIZED; \
    if (!g) return NVML_ERROR_INVALID_ARGUMENT; \
    pthread_mutex_lock(&lock); refresh(); int lost_now = g->lost; pthread_mutex_unlock(&lock); \
    if (lost_now) return NVML_ERROR_GPU_IS_LOST;

/* One value of the device; the value may use g (the device). */
#define GETTER(function, type, value) \
    nvmlReturn_t function(void *device, type *out) { \
        DEVICE(device) \
        *out = (type)(value); \
        return NVML_SUCCESS; \
    }

/* A clock by its type: NVML_CLOCK_MEM (2), or the SM/graphics clock for the others. */
#define CLOCK_GETTER(function, mem, sm) \
    nvmlReturn_t function(void *device, int type, unsigned int *clock) { \
        DEVICE(device) \
        *clock = type == 2 ? (mem) : (sm); \
        return NVML_SUCCESS; \
    }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *dir = getenv("NEBULA_SIM_DIR");
    const char *node = getenv("NEBULA_SIM_NODE");
    if (!dir) return NVML_ERROR_DRIVER_NOT_LOADED;
    pthread_mutex_lock(&lock);
    copy(sim_dir, sizeof sim_dir, dir);
    copy(sim_node, sizeof sim_node, node ? node : "");
    const char *refresh_ms = getenv("NEBULA_SIM_NVML_REFRESH_MS");
    refresh_ns = refresh_ms ? atoll(refresh_ms) * 1000000LL : REFRESH_NS;
    int ok = load_gpus();
    if (ok) {
        initialized = 1;
        refreshed_at = 0;
    }
    pthread_mutex_unlock(&lock);
    return ok ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NOT_FOUND: return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        case NVML_ERROR_TIMEOUT: return "Timeout";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (strlen(driver) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    copy(version, length, driver);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    snprintf(version, length, "12.%s", driver);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *version = cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    size_t n = fread(name, 1, length - 1, f);
    fclose(f);
    name[n] = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    for (unsigned g = 0; g < gpu_count; g++)
        if (gpus[g].index == index) { *device = &gpus[g]; return NVML_SUCCESS; }
    return NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}


GETTER(nvmlDeviceGetIndex, unsigned int, g->index)
GETTER(nvmlDeviceGetPowerUsage, unsigned int, g->power * 1000.0 + 0.5)  /* mW */
GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, g->power_limit_w * 1000.0 + 0.5)
GETTER(nvmlDeviceGetPerformanceState, int, g->pstate)
GETTER(nvmlDeviceGetPersistenceMode, int, g->persistence)
GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, g->pcie_gen)
GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, g->pcie_width)
GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, g->pcie_width)
CLOCK_GETTER(nvmlDeviceGetClockInfo, g->mem_clock, g->sm)
CLOCK_GETTER(nvmlDeviceGetMaxClockInfo, g->max_mem, g->max_sm)
CLOCK_GETTER(nvmlDeviceGetDefaultApplicationsClock, g->max_mem, g->base_sm)
#ifndef SIM_OLD_DRIVER
GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, g->pcie_gen)
#endif

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    DEVICE(device)
    copy(name, length, g->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    DEVICE(device)
    copy(uuid, length, g->uuid);
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvml_pci_info;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvml_pci_info *pci) {
    DEVICE(device)
    memset(pci, 0, sizeof *pci);
    copy(pci->busId, sizeof pci->busId, g->pci);
    copy(pci->busIdLegacy, sizeof pci->busIdLegacy, g->pci + 4);
    sscanf(g->pci, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x268410DE;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *device, nvml_pci_info *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }

typedef struct { unsigned long long total, free, used; } nvml_memory;

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvml_memory *memory) {
    DEVICE(device)
    pthread_mutex_lock(&lock);
    memory->total = g->total_mb << 20;
    memory->used = g->used_mb << 20;
    memory->free = memory->total - memory->used;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

typedef struct { unsigned gpu, memory; } nvml_utilization;

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvml_utilization *utilization) {
    DEVICE(device)
    if (g->util_na) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned)round_half_even(g->util);
    utilization->memory = (unsigned)round_half_even(g->util * 0.4);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
    DEVICE(device)
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned)round_half_even(g->temp);
    return NVML_SUCCESS;
}



nvmlReturn_t nvmlDeviceGetFanSpeed(void *device, unsigned int *speed) {
    DEVICE(device)
    if (!g->has_fan) return NVML_ERROR_NOT_SUPPORTED;
    *speed = g->fan;
    return NVML_SUCCESS;
}







#ifndef SIM_OLD_DRIVER
#endif


nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    DEVICE(device)
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, int error_type, int counter_type,
                                         unsigned long long *count) {
    DEVICE(device)
    (void)counter_type;
    if (!g->ecc) return NVML_ERROR_NOT_SUPPORTED;
    *count = error_type == 1 ? (unsigned long long)g->ecc_uncorrected : 0;  /* 1: uncorrected */
    return NVML_SUCCESS;
}

#ifndef SIM_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned int *corrected, unsigned int *uncorrected,
                                       unsigned int *pending, unsigned int *failure) {
    DEVICE(device)
    if (!g->ecc) return NVML_ERROR_NOT_SUPPORTED;
    *corrected = 0;
    *uncorrected = (unsigned)g->ecc_uncorrected;
    *pending = g->ecc_uncorrected > 0;
    *failure = 0;
    return NVML_SUCCESS;
}
#endif

static unsigned long long reasons_of(const sim_gpu *g) {
    unsigned long long reasons = g->nprocs ? 0 : REASON_IDLE;
    if (g->throttle) reasons |= REASON_HW_SLOWDOWN | REASON_HW_THERMAL;
    return reasons;
}


#ifndef SIM_OLD_DRIVER
#endif

static int instances_of(const sim_gpu *g) {
    int n = 0;
    for (unsigned m = gpu_count; m < device_count; m++) n += gpus[m].parent == g - gpus;
    return n;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending) {
    DEVICE(device)
    if (strstr(g->name, "A100") == NULL && strstr(g->name, "H100") == NULL) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = instances_of(g) > 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count) {
    DEVICE(device)
    *count = instances_of(g) > 0 ? 7 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **mig) {
    DEVICE(device)
    for (unsigned m = gpu_count; m < device_count; m++)
        if (gpus[m].parent == g - gpus && gpus[m].index == index) { *mig = &gpus[m]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long, reasons_of(g))
#ifndef SIM_OLD_DRIVER
GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, reasons_of(g))
#endif

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvml_process;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvml_process *infos) {
    DEVICE(device)
    pthread_mutex_lock(&lock);
    unsigned n = (unsigned)g->nprocs;
    if (n == 0) {
        *count = 0;
        pthread_mutex_unlock(&lock);
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = g->procs[i];
        infos[i].usedGpuMemory = per_process_memory_na ? 0xFFFFFFFFFFFFFFFFULL  /* NVML_VALUE_NOT_AVAILABLE */
                                                       : g->proc_mb[i] << 20;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = n;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

/* --- events: critical Xids from nvml_events.tsv -------------------------------------------- */

static long events_size(void) {
    char path[PATH_MAX];
    path_of(path, sizeof path, "nvml_events.tsv");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return size;
}

nvmlReturn_t nvmlEventSetCreate(sim_events **set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof **set);
    if (!*set) return NVML_ERROR_UNKNOWN;
    (*set)->offset = events_size();  /* only what happens from now on */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, sim_events *set) {
    DEVICE(device)
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    set->mask[g - gpus] |= types;
    return NVML_SUCCESS;
}

static int next_event(sim_events *set, nvml_event_data *data) {
    char path[PATH_MAX], line[128];
    path_of(path, sizeof path, "nvml_events.tsv");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int found = 0;
    if (fseek(f, set->offset, SEEK_SET) == 0) {
        while (!found && fgets(line, sizeof line, f)) {
            if (!strchr(line, '\n')) break;  /* half-written: read it next time */
            set->offset = ftell(f);
            unsigned index;
            unsigned long long code;
            if (sscanf(line, "%u\t%llu", &index, &code) != 2) continue;
            for (unsigned g = 0; g < gpu_count; g++)
                if (gpus[g].index == index && (set->mask[g] & XID_CRITICAL)) {
                    memset(data, 0, sizeof *data);
                    data->device = &gpus[g];
                    data->type = XID_CRITICAL;
                    data->data = code;
                    data->gi = data->ci = 0xFFFFFFFFu;
                    found = 1;
                }
        }
    }
    fclose(f);
    return found;
}

typedef struct {
    sim_gpu *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvml_event_v2;

nvmlReturn_t nvmlEventSetWait_v2(sim_events *set, nvml_event_v2 *data, unsigned int timeout_ms) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ns() + (long long)timeout_ms * 1000000LL;
    for (;;) {
        nvml_event_data found;
        pthread_mutex_lock(&lock);
        int got = next_event(set, &found);
        pthread_mutex_unlock(&lock);
        if (got) {
            data->device = found.device;
            data->eventType = found.type;
            data->eventData = found.data;
            data->gpuInstanceId = found.gi;
            data->computeInstanceId = found.ci;
            return NVML_SUCCESS;
        }
        if (now_ns() >= deadline) return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, 20000000L};  /* 20 ms: "within one poll" by far */
        nanosleep(&pause, NULL);
    }
}
nvmlReturn_t nvmlEventSetWait(sim_events *set, nvml_event_v2 *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

nvmlReturn_t nvmlEventSetFree(sim_events *set) {
    free(set);
    return NVML_SUCCESS;
}
