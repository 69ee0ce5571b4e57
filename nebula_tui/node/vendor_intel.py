"""Intel's backend: ``xpu-smi`` — ``discovery`` once (each device's facts, memory size with
``-d N``), then ``stats -d N`` per device and ``ps`` every probe. Jobs get
``ZE_AFFINITY_MASK`` and ``ONEAPI_DEVICE_SELECTOR=level_zero:…``. ``stats`` may report
more than 100 % utilisation; the node clamps it and says so. Travels to the nodes with the
nodelet: stdlib only, Python 3.6 syntax.
"""

from .backends import intel
from .hardware import Backend, ToolError, Unavailable, checked, one_line, vouched


class XpuSmiBackend(Backend):
    name = "xpu-smi"
    vendor = "intel"

    def __init__(self):
        self.devices = []  # discovery's readings, one per device

    def initialize(self):
        out = checked(["xpu-smi", "discovery"])
        found, _, _ = intel.parse_discovery(out)
        if not found:
            raise Unavailable("xpu-smi discovery lists no device: %s" % one_line(out))
        for device in found:
            try:
                detail, _, _ = intel.parse_discovery(
                    checked(["xpu-smi", "discovery", "-d", str(device["index"])]))
            except ToolError:
                detail = []
            self.devices.append(intel.merge(device, detail[0]) if detail else device)

    def status(self):
        readings = []
        for device in self.devices:
            out = checked(["xpu-smi", "stats", "-d", str(device["index"])])
            stats, _, _ = intel.parse_stats(out)
            if not stats:
                raise ToolError("xpu-smi stats printed no reading for device %s: %s"
                                % (device["index"], one_line(out)))
            readings.append(intel.merge(device, stats[0]))
        return readings

    def processes(self):
        uuids = dict((d["index"], d["uuid"]) for d in self.devices)
        # A failed ps fails the read, as a failed stats does: an empty list would hide
        # every process (and its memory) from the head.
        found, self.unreadable = intel.parse_ps(checked(["xpu-smi", "ps"]), set(uuids))
        for process in found:
            process["gpu_uuid"] = uuids.get(process.pop("device", None))
        if self.unreadable:
            return []
        found, self.unreadable = vouched(found, "xpu-smi ps")
        return found
