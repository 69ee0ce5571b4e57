/*
 * The simulated lab's CUDA driver: a shared library named libcuda.so.1 that a job's process
 * loads on a simulated node (the lab puts its directory on the node's LD_LIBRARY_PATH).
 *
 * It has the calls the warm-up makes (node/warmup.py) and nothing more, answered
 * from the simulated node's state:
 *   $NEBULA_SIM_DIR/cuda.tsv     "gpu<TAB>index<TAB>uuid<TAB>memory-MiB": the node's cards
 *   $NEBULA_SIM_DIR/faults.tsv   per-card faults (the same file the simulated NVML reads)
 *   $NEBULA_SIM_DIR/woken.tsv    appended: "index<TAB>epoch-seconds" when work on a card
 *                                finished; the emulated nvidia-smi and NVML show it in P0
 *                                for a while after (sim/fake_smi.py WAKE_HOLD_S)
 * Devices are the cards CUDA_VISIBLE_DEVICES names (index or UUID, a UUID prefix too), in
 * its order, up to the first entry naming none, as real CUDA reads it; unset: every card.
 * Error codes are the real ones. Which call a faulty card makes fail approximates what
 * drivers do: a card fallen off the bus (fault "lost") fails cuInit with 999 (unknown), an
 * uncorrectable ECC error not yet cleared by a reset fails its context with 214.
 * Build: cc -shared -fPIC -O2 -o libcuda.so.1 cuda_shim.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "sim_faults.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_ECC_UNCORRECTABLE = 214,
    CUDA_ERROR_UNKNOWN = 999
};

#define MAX_GPUS 16
#define MAX_ALLOCS 64

typedef struct {
    unsigned index;
    char uuid[96];
    unsigned long long total_bytes, used_bytes;
    int lost, ecc_uncorrected, retained, pending;  /* pending: work not yet synchronized */
} sim_device;

typedef struct { CUdeviceptr ptr; size_t size; int device; } allocation;

static char sim_dir[PATH_MAX - 64];
static sim_device devices[MAX_GPUS];  /* the visible cards, in CUDA's ordinal order */
static int device_count = -1;         /* -1: cuInit not yet called (or failed) */
static allocation allocs[MAX_ALLOCS];
static CUdeviceptr next_ptr = 0x7f0000000000ULL;
static __thread sim_device *current = NULL;  /* the thread's context (a primary one) */

typedef struct { unsigned index; char uuid[96]; unsigned long long mb; } card;

static int load_cards(card *cards) {
    char path[PATH_MAX], line[512];
    snprintf(path, sizeof path, "%s/cuda.tsv", sim_dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    while (n < MAX_GPUS && fgets(line, sizeof line, f)) {
        card *c = &cards[n];
        if (sscanf(line, "gpu\t%u\t%95s\t%llu", &c->index, c->uuid, &c->mb) == 3) n++;
    }
    fclose(f);
    return n;
}

static void load_fault(unsigned index, const char *key, const char *value) {
    for (int d = 0; d < device_count; d++) {
        if (devices[d].index != index) continue;
        if (strcmp(key, "lost") == 0) devices[d].lost = strcmp(value, "true") == 0;
        else if (strcmp(key, "ecc_uncorrected") == 0) devices[d].ecc_uncorrected = atoi(value) > 0;
    }
}

/* The card one CUDA_VISIBLE_DEVICES entry names, or NULL. */
static card *named(card *cards, int n, const char *entry) {
    char *end;
    long index = strtol(entry, &end, 10);
    if (end != entry && *end == 0)
        return index >= 0 && index < n ? &cards[index] : NULL;  /* an ordinal of all cards */
    if (strncmp(entry, "GPU-", 4) != 0 || strlen(entry) < 5) return NULL;
    card *found = NULL;
    for (int c = 0; c < n; c++) {
        if (strncmp(cards[c].uuid, entry, strlen(entry)) != 0) continue;
        if (found) return NULL;  /* an ambiguous prefix names none */
        found = &cards[c];
    }
    return found;
}

CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const char *dir = getenv("NEBULA_SIM_DIR");
    card cards[MAX_GPUS];
    int n = dir ? (snprintf(sim_dir, sizeof sim_dir, "%s", dir), load_cards(cards)) : -1;
    if (n <= 0) return CUDA_ERROR_NO_DEVICE;
    int count = 0;
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (!visible) {
        for (; count < n; count++) {
            memset(&devices[count], 0, sizeof devices[count]);
            devices[count].index = cards[count].index;
            snprintf(devices[count].uuid, sizeof devices[count].uuid, "%s", cards[count].uuid);
            devices[count].total_bytes = cards[count].mb << 20;
        }
    } else {
        char list[1024];
        snprintf(list, sizeof list, "%s", visible);
        for (char *save = NULL, *entry = strtok_r(list, ",", &save); entry && count < MAX_GPUS;
             entry = strtok_r(NULL, ",", &save)) {
            while (*entry == ' ') entry++;
            card *c = named(cards, n, entry);
            if (!c) break;  /* CUDA stops at the first entry naming no card */
            int twice = 0;
            for (int d = 0; d < count; d++) twice |= devices[d].index == c->index;
            if (twice) break;
            memset(&devices[count], 0, sizeof devices[count]);
            devices[count].index = c->index;
            snprintf(devices[count].uuid, sizeof devices[count].uuid, "%s", c->uuid);
            devices[count].total_bytes = c->mb << 20;
            count++;
        }
    }
    if (count == 0) return CUDA_ERROR_NO_DEVICE;
    device_count = count;
    read_faults(sim_dir, load_fault);
    for (int d = 0; d < count; d++)
        if (devices[d].lost) { device_count = -1; return CUDA_ERROR_UNKNOWN; }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **context, CUdevice device) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!context) return CUDA_ERROR_INVALID_VALUE;
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (devices[device].ecc_uncorrected) return CUDA_ERROR_ECC_UNCORRECTABLE;
    devices[device].retained++;
    *context = &devices[device];
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(void *context) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    sim_device *d = context;
    if (d && (d < devices || d >= devices + device_count || !d->retained))
        return CUDA_ERROR_INVALID_CONTEXT;
    current = d;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (current->used_bytes + size > current->total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int a = 0; a < MAX_ALLOCS; a++) {
        if (allocs[a].ptr) continue;
        allocs[a] = (allocation){next_ptr, size, (int)(current - devices)};
        next_ptr += (size + 0xfffff) & ~0xfffffULL;
        current->used_bytes += size;
        *ptr = allocs[a].ptr;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static allocation *holding(CUdeviceptr ptr, size_t size) {
    for (int a = 0; a < MAX_ALLOCS; a++)
        if (allocs[a].ptr && ptr >= allocs[a].ptr && ptr + size <= allocs[a].ptr + allocs[a].size)
            return &allocs[a];
    return NULL;
}

CUresult cuMemsetD8_v2(CUdeviceptr ptr, unsigned char value, size_t count) {
    (void)value;
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    allocation *a = holding(ptr, count);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    devices[a->device].pending = 1;
    return CUDA_SUCCESS;
}

/* The card did work: say so where the emulated nvidia-smi and NVML look (one short
 * O_APPEND write, so jobs waking cards at once never mix their lines). */
static void record_wake(const sim_device *d) {
    char path[PATH_MAX], line[64];
    struct timeval now;
    gettimeofday(&now, NULL);
    snprintf(path, sizeof path, "%s/woken.tsv", sim_dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%u\t%ld.%06ld\n", d->index, (long)now.tv_sec,
                     (long)now.tv_usec);
    if (write(fd, line, (size_t)n) != n) { /* best effort: a reading, not the job's result */ }
    close(fd);
}

CUresult cuCtxSynchronize(void) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (current->pending) record_wake(current);
    current->pending = 0;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    for (int a = 0; a < MAX_ALLOCS; a++) {
        if (allocs[a].ptr != ptr || !ptr) continue;
        devices[allocs[a].device].used_bytes -= allocs[a].size;
        allocs[a].ptr = 0;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (!devices[device].retained) return CUDA_ERROR_INVALID_CONTEXT;
    if (--devices[device].retained == 0 && current == &devices[device]) current = NULL;
    return CUDA_SUCCESS;
}

/* CUDA 11 and later export the release under this name too (what cuda.h maps it to). */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return cuDevicePrimaryCtxRelease(device);
}
