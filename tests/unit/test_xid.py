"""Xid kernel messages: every real sample parses; the cursor reads only new lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support.samples import SAMPLES as ALL_SAMPLES

from nebula_tui.remote.backends import xid
from nebula_tui.remote.backends.xid import new_lines, parse_xid, pci_key, pci_matches

SAMPLES = ALL_SAMPLES / "xid"

# file -> [(code, pci, pid)] in order, as a person reads them off the file.
EXPECTED = {
    "fallen_off_bus_without_xid_multiline_570.log": [(None, "0000:b3:00.0", None)],
    "xid119_gsp_timeout_dmesg_T_banners_a100.log": [(119, "0001:6c:00", 10200),
                                                    (119, "0001:96:00", 10200)],
    "xid13_syslog_prefix_relion.log": [(13, "0000:41:00", None)] * 8,
    "xid144_145_149_nvlink_subcodes_kmsg.log": [
        (144, "0000:01:00", None), (149, "0000:00:00", None), (149, "0000:00:00", None),
        (149, "0019:01:00", None), (145, "0018:01:00", None)],
    "xid31_journalctl_k_host0_scc.log": [(31, "0000:c1:00", 12890)] * 2,
    "xid31_single_lines_misc.log": [(31, "0000:00:06", 2708), (31, "0000:0c:00", 11461),
                                    (31, "0000:01:00", None)],
    "xid32_channel_id_old_format.log": [(32, "0000:01:00", None)] * 2,
    "xid45_caused_by_previous_xid149_145_journal.log": [
        (45, "0000:dc:00", 1818990), (45, "0000:ed:00", 1818992), (45, "0000:ba:00", 1818989),
        (45, "0000:97:00", 1818987), (45, "0000:dc:00", 1818990), (45, "0000:ba:00", 1818989),
        (45, "0000:ed:00", 1818992)],
    "xid79_fallen_off_bus_syslog_multiline_2016.log": [(79, "0000:01:00", None)],
}


def events_of(name: str) -> list[dict]:
    return parse_xid((SAMPLES / name).read_text())


def test_every_sample_is_covered():
    assert sorted(EXPECTED) == sorted(p.name for p in SAMPLES.glob("*.log"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_codes_pci_and_pids(name):
    events = events_of(name)
    assert [(e["code"], e["pci"], e["pid"]) for e in events] == EXPECTED[name]
    text = (SAMPLES / name).read_text()
    # Cross-check: one event per "NVRM: Xid (" message, plus the code-less bus falls.
    assert len([e for e in events if e["code"] is not None]) == len(re.findall(r"NVRM: Xid \(", text))
    assert json.loads(json.dumps(events)) == events  # what `nebula parse xid` prints
    for event in events:
        assert set(event) >= {"code", "pci", "pid", "process", "time", "uptime_s", "text"}
        assert "\n" not in event["text"] and event["text"].startswith("NVRM: ")


def test_times_as_written():
    assert events_of("xid119_gsp_timeout_dmesg_T_banners_a100.log")[1]["time"] == "Sun Apr 26 23:13:11 2026"
    e13 = events_of("xid13_syslog_prefix_relion.log")[0]
    assert (e13["time"], e13["uptime_s"]) == ("Feb 15 17:37:45", 82659.755847)
    assert events_of("xid31_journalctl_k_host0_scc.log")[0]["time"] == "Nov 29 11:28:11"
    e32 = events_of("xid32_channel_id_old_format.log")[0]
    assert (e32["time"], e32["uptime_s"]) == (None, 1399.140323)
    assert events_of("xid31_single_lines_misc.log")[0]["time"] is None


def test_new_style_names_and_details():
    e45 = events_of("xid45_caused_by_previous_xid149_145_journal.log")[0]
    assert e45["process"] == "python3" and e45["detail"] == "Ch 00000001 caused by previous Xid 149"
    e119 = events_of("xid119_gsp_timeout_dmesg_T_banners_a100.log")[0]
    assert e119["process"] == "NvmlTaskRunner" and "_kgspLogXid119" not in e119["text"]
    assert e119["detail"].startswith("Timeout after 45s of waiting for RPC response from GPU5 GSP!")
    e31 = events_of("xid31_journalctl_k_host0_scc.log")[0]
    assert e31["process"] is None and e31["detail"].startswith("Ch 0000003b, intr 00000000. MMU Fault")
    # The banner's UUID was redacted in the sample: no UUID rather than a broken one.
    assert e31["uuid"] is None


def test_fallen_off_bus_folds_continuations_and_repeats():
    (event,) = events_of("fallen_off_bus_without_xid_multiline_570.log")
    assert event["text"] == ("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in "
                             "this system has fallen off the bus and is not responding to commands.")
    assert event["uptime_s"] == 1843.308145
    (e79,) = events_of("xid79_fallen_off_bus_syslog_multiline_2016.log")
    # The blank continuation record and the "GPU at … has fallen off the bus" repeat join the
    # Xid; the crash-dump note and gnome-session's lines are not events.
    assert e79["detail"] == "GPU has fallen off the bus."
    assert e79["text"].endswith("NVRM: GPU at 0000:01:00.0 has fallen off the bus.")
    assert e79["uuid"] == "GPU-c4a80165-86e4-bfbb-ecfa-1d81a70b138a"
    assert "crash dump" not in e79["text"] and "nvctrl" not in e79["text"]


def test_multiline_message_in_syslog_records():
    # The same 570 message as syslog writes it: one record per line, same stamp.
    prefix = "Jun  3 10:00:00 node7 kernel: "
    lines = [
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "[ 1843.308145] NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "[ 1843.308145] NVRM: fallen off the bus and is not responding to commands.",
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    ]
    (event,) = parse_xid("\n".join(prefix + line for line in lines))
    assert (event["code"], event["pci"], event["time"]) == (None, "0000:b3:00.0", "Jun  3 10:00:00")
    assert event["text"].endswith("has fallen off the bus and is not responding to commands.")


def test_indented_continuation_and_unknown_pid():
    text = (
        "[168429.114550] NVRM: Xid (PCI:0000:65:00): 94, pid='<unknown>', name=<unknown>,\n"
        "                Contained: CE User Channel (0x9). RST: No, D-RST: No\n"
        "[168429.118002] NVRM: Xid (PCI:0000:65:00): 63, pid='<unknown>', name=<unknown>,\n"
        "                Row Remapper: New row marked for remapping, reset gpu to activate.\n"
    )
    e94, e63 = parse_xid(text)
    assert (e94["code"], e94["pid"], e94["process"]) == (94, None, None)
    assert e94["detail"] == "Contained: CE User Channel (0x9). RST: No, D-RST: No"
    assert e63["text"].endswith("reset gpu to activate.") and e63["uptime_s"] == 168429.118002


@pytest.mark.parametrize("line, code, pci, pid, time, uptime", [
    # dmesg with the caller id of newer kernels
    ("[  130.456250] [ T1946] NVRM: Xid (PCI:0000:2b:00): 31, pid=1942, name=llama-bench, channel "
     "0x00000002, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC6", 31, "0000:2b:00", 1942, None, 130.45625),
    # dmesg --time-format iso
    ("2026-04-26T23:12:26,123456+00:00 NVRM: Xid (PCI:0000:8a:00): 48, An uncorrectable double bit "
     "error (DBE) has been detected", 48, "0000:8a:00", None, "2026-04-26T23:12:26,123456+00:00", None),
    # rsyslog with ISO time
    ("2024-05-19T07:08:57.123456+00:00 ip-26-0 kernel: NVRM: Xid (PCI:0000:10:1c): 63, pid=1850, "
     "Row Remapper: New row marked for remapping", 63, "0000:10:1c", 1850,
     "2024-05-19T07:08:57.123456+00:00", None),
    # journalctl -k -o short-monotonic
    ("[155044.078590] gpu7 kernel: NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
     79, "0000:06:00", None, None, 155044.07859),
    # journalctl --no-hostname, kernel: only
    ("kernel: NVRM: Xid (PCI:0000:c1:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
     "detected on link 1", 74, "0000:c1:00", None, None, None),
    # a /dev/kmsg record
    ("4,1094,155044078590,-;NVRM: Xid (PCI:0004:01:00): 119, pid=430, name=nv_queue, Timeout waiting "
     "for RPC from GSP!", 119, "0004:01:00", 430, None, 155044.07859),
    # very old drivers: no "PCI:"
    ("NVRM: Xid (0000:02:00): 13, 0001 00000000 000090c0 00001b0c 00000000 00000000",
     13, "0000:02:00", None, None, None),
    # a kernel log level in front (dmesg -r)
    ("<4>[ 8659.726062] NVRM: Xid (PCI:0000:01:00): 43, Ch 00000020, engmask 00000101",
     43, "0000:01:00", None, None, 8659.726062),
])
def test_one_line_formats(line, code, pci, pid, time, uptime):
    (event,) = parse_xid(line + "\n")
    assert (event["code"], event["pci"], event["pid"], event["time"], event["uptime_s"]) == \
        (code, pci, pid, time, uptime)


def test_kmsg_dictionary_lines_are_not_text():
    text = ("3,2001,1843308145,-;NVRM: Xid (PCI:0000:b3:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b3:00.0\n")
    (event,) = parse_xid(text)
    assert "SUBSYSTEM" not in event["text"] and event["detail"] == "GPU has fallen off the bus."


def test_bus_fall_of_another_gpu_is_its_own_event():
    text = ("[  100.000000] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
            "[  100.000004] NVRM: GPU 0000:02:00.0: GPU has fallen off the bus.\n"
            "[  900.000000] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.\n")
    assert [(e["code"], e["pci"]) for e in parse_xid(text)] == [
        (79, "0000:01:00"), (None, "0000:02:00.0"), (None, "0000:01:00.0")]


def test_an_unreadable_or_redacted_address_keeps_the_code():
    # Addresses are redacted when logs are posted; the code is what the policies act on.
    cases = {"NVRM: Xid (PCI:zz:zz): 79, broken": (79, "zz:zz", None),
             "[  99.1] NVRM: Xid (PCI:xxxx:xx:xx): 31, pid=42, name=python3, Ch 0000003b": (
                 31, "xxxx:xx:xx", 42),
             "kernel: NVRM: Xid (<redacted>): 48, An uncorrectable double bit error": (
                 48, "<redacted>", None),
             "NVRM: Xid (PCI:0000:01:00.0 GPU-<uuid redacted>): 13, Graphics Exception": (
                 13, "0000:01:00.0", None)}
    for line, expected in cases.items():
        (event,) = parse_xid(line + "\n")
        assert (event["code"], event["pci"], event["pid"]) == expected, line
    assert not pci_matches("zz:zz", "00000000:01:00.0")


def test_not_events():
    assert parse_xid("") == []
    assert parse_xid("random words\n[  1.0] usb 1-1: new device\nkernel: NVRM: loading driver\n") == []


@pytest.mark.parametrize("kernel, smi, same", [
    ("0000:01:00", "00000000:01:00.0", True),
    ("0000:c1:00", "00000000:C1:00.0", True),
    ("0001:6c:00", "00000001:6C:00.0", True),
    ("0000:b3:00.0", "00000000:B3:00.0", True),
    ("0000:b3:00.1", "00000000:B3:00.0", False),
    ("0000:01:00", "00000000:02:00.0", False),
    ("0001:01:00", "00000000:01:00.0", False),
    ("PCI:0000:10:1c", "00000000:10:1C.0", True),
    ("garbage", "00000000:01:00.0", False),
])
def test_pci_matches(kernel, smi, same):
    assert pci_matches(kernel, smi) is same
    assert pci_matches(smi, kernel) is same


def test_pci_key():
    assert pci_key("00000000:C1:00.0") == (0, 0xC1, 0, 0)
    assert pci_key("0000:c1:00") == (0, 0xC1, 0, None)
    assert pci_key("") is None


def test_catalog_names_the_policy_codes():
    for code in (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95, 119):
        assert xid.XID_CATALOG[code].meaning and xid.XID_CATALOG[code].action
    assert xid.meaning(None) == "GPU fell off the bus"


# --- new_lines: the node's cursor -------------------------------------------------------------

BOOT = "5c0e4a9e-1111-2222-3333-444455556666"


def dmesg(*stamps: float, prefix: str = "line") -> str:
    return "".join(f"[{s:12.6f}] {prefix} {s}\n" for s in stamps)


def test_first_look_is_history_and_appends_are_new():
    lines, cursor = new_lines(dmesg(1, 2, 3), None, BOOT)
    assert lines == []
    assert new_lines(dmesg(1, 2, 3), None, BOOT, start_at_end=False)[0] == dmesg(1, 2, 3).splitlines()
    lines, cursor = new_lines(dmesg(1, 2, 3, 4, 5), cursor, BOOT)
    assert lines == dmesg(4, 5).splitlines()
    lines, cursor = new_lines(dmesg(1, 2, 3, 4, 5), cursor, BOOT)
    assert lines == []
    assert json.loads(json.dumps(cursor)) == cursor  # kept on disk by the node


def test_ring_buffer_dropping_old_lines_does_not_repeat_them():
    _, cursor = new_lines(dmesg(1, 2, 3), None, BOOT)
    lines, cursor = new_lines(dmesg(3, 4), cursor, BOOT)  # 1 and 2 fell out of the buffer
    assert lines == dmesg(4).splitlines()
    lines, _ = new_lines(dmesg(9), cursor, BOOT)  # everything we saw is gone; 9 is new
    assert lines == dmesg(9).splitlines()


def test_same_stamp_records_and_continuations():
    first = "[  5.000000] a\n[  5.000000] b\n"
    _, cursor = new_lines(first, None, BOOT)
    more = first + "[  5.000000] c\n               continued c\n[  6.000000] d\n"
    lines, _ = new_lines(more, cursor, BOOT)
    assert lines == ["[  5.000000] c", "               continued c", "[  6.000000] d"]


def test_reboot_starts_over():
    _, cursor = new_lines(dmesg(100, 200, 300), None, BOOT)
    after = dmesg(0.5, 400)  # the new boot already ran past the old stamps
    lines, cursor = new_lines(after, cursor, "another-boot")
    assert lines == after.splitlines()
    assert new_lines(after, cursor, "another-boot")[0] == []


def test_cleared_or_restarted_log_without_new_boot_id():
    _, cursor = new_lines(dmesg(100, 200), None, BOOT)
    lines, _ = new_lines(dmesg(1, 2), cursor, BOOT)  # newest stamp older than the cursor's
    assert lines == dmesg(1, 2).splitlines()
    _, cursor = new_lines(dmesg(100, 200), None, BOOT)
    lines, _ = new_lines(dmesg(300), cursor, BOOT)  # dmesg -C, then one new line
    assert lines == dmesg(300).splitlines()


def test_partial_last_line_waits():
    _, cursor = new_lines("", None, BOOT)
    lines, cursor = new_lines("[  1.000000] whole\n[  2.000000] half", cursor, BOOT)
    assert lines == ["[  1.000000] whole"]
    lines, _ = new_lines("[  1.000000] whole\n[  2.000000] half line\n", cursor, BOOT)
    assert lines == ["[  2.000000] half line"]


def test_unstamped_log_by_offset_with_rotation():
    log = "Feb 1 a\nFeb 1 b\n"
    _, cursor = new_lines(log, None, BOOT)
    lines, cursor = new_lines(log + "Feb 1 c\n", cursor, BOOT)
    assert lines == ["Feb 1 c"]
    lines, cursor = new_lines("Feb 2 x\n", cursor, BOOT)  # rotated: shorter
    assert lines == ["Feb 2 x"]
    lines, _ = new_lines("Feb 2 y\nFeb 2 z\nFeb 2 w\n", cursor, BOOT)  # rotated, same length or more
    assert lines == ["Feb 2 y", "Feb 2 z", "Feb 2 w"]


def test_syslog_with_uptime_and_journal_monotonic_use_stamps():
    text = ("Feb 15 17:37:45 host kernel: [82659.755847] one\n"
            "Feb 15 17:37:45 host gnome-session[17]: [2016-12-06T17:49:04] other\n")
    _, cursor = new_lines(text, None, BOOT)
    assert cursor["stamp"] == 82659.755847
    lines, _ = new_lines(text + "[82700.000000] gpu7 kernel: two\n", cursor, BOOT)
    assert lines == ["[82700.000000] gpu7 kernel: two"]


def test_new_lines_runs_standalone_as_shipped_to_the_nodelet():
    # The node gets kmsg_cursor.py as a module of its own: it must run without the package.
    from nebula_tui.node import kmsg_cursor

    namespace: dict = {"__name__": "nodelet"}
    exec(compile(Path(kmsg_cursor.__file__).read_text(), "kmsg_cursor", "exec"), namespace)  # noqa: S102
    lines, cursor = namespace["new_lines"](dmesg(1, 2), None, BOOT, False)
    assert lines == dmesg(1, 2).splitlines() and cursor["stamp"] == 2
    assert xid.new_lines is kmsg_cursor.new_lines
