"""Parse ``nvidia-smi topo -m``: the GPU×GPU link matrix, GPUs only (NIC columns dropped).

Cells are separated by tabs on current drivers and by runs of spaces on older ones; rows
may end with trailing tabs or empty affinity cells. Only the ``GPUn`` columns are read, by
position, so extra columns (NICs, CPU/NUMA affinity) never shift the links. Travels to the
nodes with the nodelet (stdlib only, Python 3.6 syntax, no annotations).
"""

import re

_GPU = re.compile(r"^GPU\d+$")


def parse_topo(text):
    """``{"gpus": ["GPU0", …], "links": {"GPU0": {"GPU1": "NV4", …}, …}}``.

    Raises ValueError when no matrix header (a line naming GPU0) is found.
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if _cells(line)[:1] == ["GPU0"]), None)
    if header_at is None:
        raise ValueError("no topology matrix found (expected a header line starting with GPU0)")
    columns = _cells(lines[header_at])
    gpu_columns = [(pos, name) for pos, name in enumerate(columns) if _GPU.match(name)]
    gpus = [name for _, name in gpu_columns]
    links = {}
    for line in lines[header_at + 1:]:
        cells = _cells(line)
        if not cells:
            if links:
                break  # the blank line before the legend ends the matrix
            continue
        row, values = cells[0], cells[1:]
        if not _GPU.match(row):
            continue
        links[row] = {
            name: values[pos] for pos, name in gpu_columns
            if pos < len(values) and name != row and values[pos] != "X"
        }
    return {"gpus": gpus, "links": links}


def _cells(line):
    """Split a matrix line: tabs when present (cells may hold spaces), else whitespace."""
    if "\t" in line:
        parts = [c.strip() for c in line.split("\t")]
        if parts and parts[0] == "":
            parts = parts[1:]  # the header line starts with a tab
        return parts if any(parts) else []
    return line.split()


def nvlink_peers(topo, gpu_index):
    """R2 ``nvlink``: the GPUs this one reaches over NVLink, with the link as written."""
    links = topo.get("links", {}).get(f"GPU{gpu_index}", {})
    return [{"gpu": int(peer[3:]), "link": link} for peer, link in sorted(links.items())
            if link.startswith("NV")]
