"""Wakes the visible NVIDIA cards before a job's command starts (R27); run by the job's
wrapper with the node's python3 and ``CUDA_VISIBLE_DEVICES`` set to the job's cards.

A card idling in P8 takes hundreds of milliseconds to reach P0 when work first arrives, and
without persistence mode the driver also starts afresh for the first process. A light
pre-allocation through the CUDA driver API (a context, 64 MiB written and freed, on each
card) does that before the job's clock starts. Stdlib only (ctypes); it prints one line for
the job's log and never fails the job.
"""

import ctypes
import sys
import time

SIZE = 64 << 20


def warm(cuda):
    """The number of cards woken; raises RuntimeError naming the call that failed."""
    def call(name, *args):
        fn = getattr(cuda, name + "_v2", None) or getattr(cuda, name)
        code = fn(*args)
        if code != 0:
            raise RuntimeError("%s failed with CUDA error %d" % (name, code))

    call("cuInit", 0)
    count = ctypes.c_int()
    call("cuDeviceGetCount", ctypes.byref(count))
    for ordinal in range(count.value):
        device, context, memory = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        call("cuDeviceGet", ctypes.byref(device), ordinal)
        call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        call("cuCtxSetCurrent", context)
        call("cuMemAlloc", ctypes.byref(memory), ctypes.c_size_t(SIZE))
        call("cuMemsetD8", memory, ctypes.c_ubyte(0), ctypes.c_size_t(SIZE))
        call("cuCtxSynchronize")
        call("cuMemFree", memory)
        call("cuDevicePrimaryCtxRelease", device)
    return count.value


def main(node):
    started = time.monotonic()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        print("nebula: warm-up skipped: %s has no CUDA driver library (libcuda.so.1)" % node)
        return
    try:
        count = warm(cuda)
    except (RuntimeError, AttributeError) as err:
        print("nebula: warm-up skipped on %s: %s" % (node, err))
        return
    print("nebula: warm-up: %d GPU%s woken in %.0f ms" % (
        count, "" if count == 1 else "s", (time.monotonic() - started) * 1000))


main(sys.argv[1] if len(sys.argv) > 1 else "this node")
