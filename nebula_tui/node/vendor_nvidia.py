"""NVIDIA's backends: NVML through ``pynvml`` (preferred), ``nvidia-smi`` when NVML cannot load.

NVML: handles are opened once and queried every interval in this long-lived process, no
process spawned per probe. ``pynvml`` travels with the nodelet (never installed); a call
the driver lacks (old drivers) or refuses (``Not Supported``) is a missing value, never a
failed probe, and a function found missing once is not asked again. Critical Xids come
from NVML's event set (``watch``) as they happen, beside the kernel log.

``nvidia-smi``: one ``--query-gpu`` and one ``--query-compute-apps`` per probe; a driver
that does not know one of the extra fields refuses the query naming it, and the field is
left out from then on.

Travels to the nodes with the nodelet: stdlib only (and pynvml), Python 3.6 syntax.
"""

import os
import time

from .backends import nvidia_smi
from .backends import reading as rd
from .backends import topo
from .hardware import (Backend, ToolError, Unavailable, checked, links_from, one_line,
                       process_name, run_tool, which)


def _text(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return rd.text(value)


#: Where drivers put NVML besides the loader's own paths (containers, WSL, old packages).
_NVML_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
              "/usr/lib", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib")


def nvml_detected():
    """Whether libnvidia-ml.so.1 is on this node (LD_LIBRARY_PATH, the usual places, or
    the loader's cache); initialize() then loads it."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(_NVML_DIRS)
    if any(os.path.exists(os.path.join(d, "libnvidia-ml.so.1")) for d in dirs):
        return True
    try:
        import ctypes.util
        return ctypes.util.find_library("nvidia-ml") is not None
    except Exception:
        return False


def _topology():
    """``nvidia-smi topo -m`` as links, when the tool is there (asked once)."""
    return links_from(["nvidia-smi", "topo", "-m"], lambda out: topo.parse_topo(out)["links"])


class NvmlBackend(Backend):
    name = "nvml"
    vendor = "nvidia"

    def __init__(self):
        self.nv = None
        self.gpus = []  # [(handle, static facts as a reading)]
        self.migs = []  # [(handle, static facts)] of MIG instances
        self.missing = set()  # NVML functions this driver lacks
        self.warnings = []

    # -------------------------------------------------------------- queries
    def _q(self, name, *args):
        """``pynvml.<name>(*args)``, or None when the driver lacks it, refuses it or fails."""
        if name in self.missing:
            return None
        nv = self.nv
        function = getattr(nv, name, None)
        if function is None:
            self.missing.add(name)
            return None
        try:
            return function(*args)
        except nv.NVMLError as err:
            code = getattr(err, "value", None)
            if code == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                self.missing.add(name)
            elif code in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_UNKNOWN):
                raise  # the card itself does not answer: status() says it is lost
            return None

    def initialize(self):
        try:
            import pynvml
        except Exception as err:  # not shipped, or this python cannot load it
            raise Unavailable("pynvml could not be loaded: %s" % rd.text(str(err)))
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise Unavailable("NVML: %s" % err)
        count = self._q("nvmlDeviceGetCount") or 0
        if not count:
            raise Unavailable("NVML lists no GPU")
        driver = _text(self._q("nvmlSystemGetDriverVersion"))
        for index in range(count):
            handle = self._q("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                self.warnings.append("NVML cannot open GPU %d" % index)
                continue
            try:
                static = self._static(handle, index, driver)
                self.gpus.append((handle, static))
                if static["mig_mode"] == "Enabled":
                    self._open_migs(handle, static, driver)
            except pynvml.NVMLError as err:  # lost already: the others still serve
                self.warnings.append("GPU %d: %s" % (index, err))
        if not self.gpus:
            raise Unavailable("NVML cannot read any of its %d GPUs: %s" % (count, "; ".join(self.warnings)))

    def _static(self, handle, index, driver):
        nv = self.nv
        pci = self._q("nvmlDeviceGetPciInfo", handle)
        memory = self._q("nvmlDeviceGetMemoryInfo", handle)
        capability = self._q("nvmlDeviceGetCudaComputeCapability", handle)
        mode = self._q("nvmlDeviceGetMigMode", handle)  # [current, pending]
        return rd.new_reading(
            "nvidia", index,
            uuid=_text(self._q("nvmlDeviceGetUUID", handle)) or "",
            name=_text(self._q("nvmlDeviceGetName", handle)) or "",
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            memory_total_mb=memory.total // 2**20 if memory is not None else None,
            base_sm_clock_mhz=self._q("nvmlDeviceGetDefaultApplicationsClock", handle, nv.NVML_CLOCK_SM),
            max_sm_clock_mhz=self._q("nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_SM),
            max_mem_clock_mhz=self._q("nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_MEM),
            pcie_gen_max=self._q("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            pcie_width_max=self._q("nvmlDeviceGetMaxPcieLinkWidth", handle),
            compute_cap="%d.%d" % tuple(capability) if capability else None,
            mig_mode=None if not mode else ("Enabled" if mode[0] == 1 else "Disabled"),
            driver_version=driver,
        )

    def _open_migs(self, handle, parent, driver):
        for slot in range(self._q("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self._q("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:
                continue  # an empty slot
            uuid = _text(self._q("nvmlDeviceGetUUID", mig)) or ""
            memory = self._q("nvmlDeviceGetMemoryInfo", mig)
            self.migs.append((mig, rd.new_reading(
                "nvidia", None, uuid=uuid, parent_uuid=parent["uuid"], visible_id=uuid,
                name=_text(self._q("nvmlDeviceGetName", mig)) or parent["name"] + " MIG",
                pci_bus_id=parent["pci_bus_id"], compute_cap=parent["compute_cap"],
                memory_total_mb=memory.total // 2**20 if memory is not None else None,
                driver_version=driver)))

    def status(self):
        self.warnings = []
        readings = []
        for handle, static in self.gpus:
            try:
                readings.append(self._dynamic(handle, static))
            except self.nv.NVMLError as err:  # only GPU_IS_LOST and UNKNOWN get here
                self.warnings.append("GPU %s (%s): %s" % (static["index"], static["pci_bus_id"], err))
                readings.append(dict(static, lost="NVML: %s" % rd.text(str(err))))
        for handle, static in self.migs:
            reading = dict(static)
            memory = self._safe("nvmlDeviceGetMemoryInfo", handle)
            if memory is not None:
                reading["memory_used_mb"] = memory.used // 2**20
            readings.append(reading)
        return readings

    def _safe(self, name, *args):
        try:
            return self._q(name, *args)
        except self.nv.NVMLError:
            return None

    def _dynamic(self, handle, static):
        nv, q = self.nv, self._q
        reading = dict(static)
        memory = q("nvmlDeviceGetMemoryInfo", handle)
        utilization = q("nvmlDeviceGetUtilizationRates", handle)
        power = q("nvmlDeviceGetPowerUsage", handle)
        limit = q("nvmlDeviceGetEnforcedPowerLimit", handle)
        pstate = q("nvmlDeviceGetPerformanceState", handle)
        remapped = q("nvmlDeviceGetRemappedRows", handle)
        persistence = q("nvmlDeviceGetPersistenceMode", handle)
        reasons = q("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = q("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        reading.update(
            memory_total_mb=memory.total // 2**20 if memory is not None else static["memory_total_mb"],
            memory_used_mb=memory.used // 2**20 if memory is not None else None,
            utilization_pct=float(utilization.gpu) if utilization is not None else None,
            temperature_c=_float(q("nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU)),
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            fan_pct=_float(q("nvmlDeviceGetFanSpeed", handle)),
            sm_clock_mhz=_float(q("nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_SM)),
            mem_clock_mhz=_float(q("nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_MEM)),
            pstate="P%d" % pstate if isinstance(pstate, int) and 0 <= pstate < 32 else None,
            pcie_gen=q("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            pcie_width=q("nvmlDeviceGetCurrPcieLinkWidth", handle),
            ecc_uncorrected=q("nvmlDeviceGetTotalEccErrors", handle,
                              nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            ecc_corrected=q("nvmlDeviceGetTotalEccErrors", handle,
                            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            throttle_reasons=nvidia_smi.throttle_names(reasons),
            persistence_mode=None if persistence is None else ("Enabled" if persistence else "Disabled"),
        )
        if remapped is not None:
            reading.update(remapped_rows_correctable=remapped[0],
                           remapped_rows_uncorrectable=remapped[1],
                           remapped_rows_pending=bool(remapped[2]),
                           remapped_rows_failure=bool(remapped[3]))
        return reading

    def processes(self):
        found = []
        for handle, static in self.gpus + self.migs:
            for process in self._safe("nvmlDeviceGetComputeRunningProcesses", handle) or []:
                used = getattr(process, "usedGpuMemory", None)
                found.append(rd.new_process(static["uuid"], int(process.pid),
                                            process_name(int(process.pid)),
                                            used // 2**20 if isinstance(used, int) else None))
        return found

    def facts(self):
        cuda = self._safe("nvmlSystemGetCudaDriverVersion")
        return {"driver_version": _text(self._safe("nvmlSystemGetDriverVersion")),
                "cuda_version": "%d.%d" % (cuda // 1000, cuda % 1000 // 10) if cuda else None,
                "links": _topology()}

    def watch(self, report):
        """Report each critical Xid NVML signals: ``report(reading, code)``. Returns when the
        driver has no event sets (then only the kernel log tells of Xids)."""
        nv = self.nv
        events = self._safe("nvmlEventSetCreate")
        if events is None:
            return
        registered = 0
        for handle, _ in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except nv.NVMLError:
                pass  # this GPU (or driver) has no Xid events
        if not registered:
            return
        by_uuid = dict((static["uuid"], static) for _, static in self.gpus)
        while True:
            try:
                data = nv.nvmlEventSetWait(events, 5000)
            except nv.NVMLError as err:
                if getattr(err, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    continue
                if getattr(err, "value", None) in (nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                                                   nv.NVML_ERROR_NOT_SUPPORTED):
                    return
                time.sleep(5)
                continue
            uuid = _text(self._safe("nvmlDeviceGetUUID", data.device))
            if data.eventType & nv.nvmlEventTypeXidCriticalError and uuid in by_uuid:
                report(by_uuid[uuid], int(data.eventData))

    def cleanup(self):
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass


def _float(value):
    return None if value is None else float(value)


#: Where the kernel lists PCI devices: a card still there that the tool no longer shows is
#: lost, not removed.
PCI_DEVICES = "/sys/bus/pci/devices"


def _pci_listed(bus_id):
    """Whether the kernel still lists the PCI device ``bus_id`` (nvidia-smi writes 8 hex
    digits of domain, sysfs 4); None when this node has no sysfs to ask."""
    if not os.path.isdir(PCI_DEVICES):
        return None
    return os.path.exists(os.path.join(PCI_DEVICES, bus_id[-12:].lower()))


class NvidiaSmiBackend(Backend):
    name = "nvidia-smi"
    vendor = "nvidia"

    def __init__(self):
        self.fields = list(nvidia_smi.QUERY_GPU_FIELDS + nvidia_smi.QUERY_GPU_EXTRA_FIELDS)
        self.warnings = []
        self.cuda_version = None
        self.seen = {}  # uuid -> the device's facts as last read: a card that vanishes stays, lost

    def initialize(self):
        if not which("nvidia-smi"):
            raise Unavailable("nvidia-smi is not on PATH")
        if not self.status():
            raise Unavailable("nvidia-smi lists no GPU")

    def _query(self):
        """The GPU query's output; a field this driver refuses is dropped and asked again."""
        while True:
            code, out, err = run_tool(nvidia_smi.query_gpu_argv(self.fields))
            refused = nvidia_smi.unknown_field(out + err)
            if code == 2 and refused and refused.lower() in self.fields \
                    and refused.lower() not in nvidia_smi.QUERY_GPU_FIELDS:
                self.fields.remove(refused.lower())
                continue
            if code not in (0, 15):  # 15: a GPU fell off the bus; the others still have rows
                raise ToolError("nvidia-smi exited with %d: %s" % (code, (err or out).strip()[:200]))
            return out

    def status(self):
        out = self._query()
        try:
            readings, warnings = nvidia_smi.parse_query_gpu_lines(out.splitlines(), self.fields)
        except nvidia_smi.ParseError as err:
            raise ToolError("nvidia-smi printed something other than the CSV asked for: %s" % err)
        if not readings and not warnings and out.strip():
            raise ToolError("nvidia-smi printed no GPU it can read: %s" % one_line(out))
        self.warnings = warnings
        return readings + self._lost(readings, nvidia_smi.lost_devices(out.splitlines()))

    def _lost(self, readings, named):
        """The cards read before that this read lacks, as lost: the tool named them lost
        ("GPU is lost", "Unknown Error"), or shows them no more — whether the kernel still
        lists the PCI device or not, a card does not leave a running node by itself."""
        for reading in readings:
            if reading.get("uuid"):
                self.seen[reading["uuid"]] = reading
        here = set(r.get("uuid") for r in readings)
        lost = []
        for uuid, last in self.seen.items():
            if uuid in here:
                continue
            bus = (last.get("pci_bus_id") or "").lower()
            why = next((w for named_id, w in named if named_id.lower().endswith(bus[-12:]) and bus), None)
            if why:
                why = "nvidia-smi: %s" % why
            elif _pci_listed(bus) is False:
                why = "gone from the PCI bus (nvidia-smi no longer shows it)"
            else:
                why = "still on the PCI bus, but nvidia-smi no longer shows it"
            keep = ("uuid", "name", "pci_bus_id", "memory_total_mb", "compute_cap",
                    "driver_version", "visible_env", "visible_id")
            lost.append(rd.new_reading("nvidia", last["index"], lost=why,
                                       **dict((k, last.get(k)) for k in keep)))
        return lost

    def processes(self):
        fields = nvidia_smi.PROBE_APPS_FIELDS  # no names: nvidia-smi prints them unquoted
        code, out, err = run_tool(nvidia_smi.query_apps_argv(fields=fields))
        if code not in (0, 15):
            return []
        try:
            found = nvidia_smi.parse_query_apps_lines(out.splitlines(), fields)
        except nvidia_smi.ParseError:
            return []
        for process in found:
            process["name"] = process_name(process["pid"])
        return found

    def facts(self):
        cuda = None
        try:
            cuda = nvidia_smi.parse_plain_table(checked(["nvidia-smi"], ok=(0, 15)))["cuda_version"]
        except ToolError:
            pass
        return {"cuda_version": cuda, "links": _topology()}
