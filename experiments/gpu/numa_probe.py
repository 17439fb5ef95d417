"""This machine's NUMA nodes and what reaching another node's memory costs.

Prints the nodes (from /sys/devices/system/node), each GPU's node (from its PCI device), and,
where there are two or more nodes, a bandwidth matrix: CPU threads of node a reading and
writing a buffer whose pages live on node b (placed by first touch: a thread pinned to node b's
CPUs writes it first; `/proc/self/numa_maps` confirms where the pages went), and host-to-device
copies from pinned buffers on each node to each GPU. This is the measurement a measured slow
tier for host mode (remote-node memory, issue 17) and NUMA-aware worker pinning would rest on;
on a machine with one node it says so and stops after the listing.

    python3 experiments/gpu/numa_probe.py [--mib 1024] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

NODES = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_nodes(root: Path = NODES) -> dict[int, list[int]]:
    """Node -> its CPUs (nodes without CPUs kept, with none)."""
    nodes = {}
    for d in sorted(root.glob("node[0-9]*")):
        nodes[int(d.name[4:])] = parse_cpulist((d / "cpulist").read_text())
    return nodes


def gpu_nodes() -> dict[int, int]:
    """nvidia-smi index -> NUMA node of its PCI device (-1: the kernel does not say)."""
    try:
        query = ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True, check=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.strip().splitlines():
        index, bus = (s.strip() for s in line.split(","))
        bus = bus.lower()[-12:]  # 00000000:1B:00.0 -> 0000:1b:00.0
        node_file = Path("/sys/bus/pci/devices") / bus / "numa_node"
        found[int(index)] = int(node_file.read_text()) if node_file.exists() else -1
    return found


def pages_on(ptr: int) -> str:
    """The N<node>=<pages> fields of the mapping holding `ptr`, from /proc/self/numa_maps."""
    best = ""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        start = int(line.split()[0], 16)
        if start <= ptr:
            best = line  # mappings are listed in address order
        else:
            break
    return " ".join(re.findall(r"N\d+=\d+", best))


def on_cpus(cpus: list[int], fn):
    """Run fn in a thread pinned to `cpus` (first touch then places its pages on their node)."""
    box = {}

    def body() -> None:
        os.sched_setaffinity(0, set(cpus))
        box["value"] = fn()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return box["value"]


def seconds_on(cpus: list[int], op) -> float:
    """Mean seconds of `op` over five runs after a warm-up, in a thread pinned to `cpus`."""
    def run() -> float:
        op()
        start = time.perf_counter()
        for _ in range(5):
            op()
        return (time.perf_counter() - start) / 5
    return on_cpus(cpus, run)


def cpu_matrix(nodes: dict[int, list[int]], nbytes: int) -> list[dict]:
    import torch
    rows = []
    with_cpus = {n: c for n, c in nodes.items() if c}
    for mem_node, mem_cpus in with_cpus.items():
        buf = on_cpus(mem_cpus, lambda: torch.ones(nbytes // 4, dtype=torch.float32))
        placed = pages_on(buf.data_ptr())
        for cpu_node, cpus in with_cpus.items():
            torch.set_num_threads(len(cpus))
            read = nbytes / seconds_on(cpus, buf.sum) / 1e9
            write = nbytes / seconds_on(cpus, functools.partial(buf.fill_, 1.0)) / 1e9
            rows.append({"cpu_node": cpu_node, "memory_node": mem_node, "read_GBps": read,
                         "write_GBps": write, "pages": placed})
            print(f"CPUs of node {cpu_node} <- memory of node {mem_node} ({placed}): "
                  f"read {read:6.1f} GB/s, write {write:6.1f} GB/s")
    return rows


def gpu_matrix(nodes: dict[int, list[int]], nbytes: int) -> list[dict]:
    import torch
    if not torch.cuda.is_available():
        return []
    rows = []
    for mem_node, cpus in ((n, c) for n, c in nodes.items() if c):
        host = on_cpus(cpus, lambda: torch.ones(nbytes // 4, dtype=torch.float32).pin_memory())
        placed = pages_on(host.data_ptr())
        for gpu in range(torch.cuda.device_count()):
            dev = torch.empty_like(host, device=f"cuda:{gpu}")
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(gpu)
            start = time.perf_counter()
            for _ in range(5):
                dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(gpu)
            bw = 5 * nbytes / (time.perf_counter() - start) / 1e9
            rows.append({"gpu": gpu, "memory_node": mem_node, "h2d_GBps": bw, "pages": placed})
            print(f"GPU {gpu} <- pinned memory of node {mem_node} ({placed}): {bw:6.1f} GB/s")
            del dev
        del host
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--json")
    args = ap.parse_args()
    nodes = numa_nodes()
    gpus = gpu_nodes()
    for node, cpus in nodes.items():
        print(f"node {node}: {len(cpus)} CPUs ({cpus[:1]}..{cpus[-1:]})")
    for gpu, node in gpus.items():
        print(f"GPU {gpu}: NUMA node {node}")
    doc = {"nodes": {str(n): c for n, c in nodes.items()}, "gpu_nodes": gpus}
    if len(nodes) < 2:
        print(f"{len(nodes)} NUMA node(s): no remote-node memory to measure on this machine")
    else:
        nbytes = args.mib << 20
        doc["cpu"] = cpu_matrix(nodes, nbytes)
        doc["gpu"] = gpu_matrix(nodes, nbytes)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
