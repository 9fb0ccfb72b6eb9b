"""``kiln devices``, and the multi-device side of ``kiln compile``, ``kiln inspect`` and ``kiln dump``
(``--devices``, ``--device-memory``, ``--parallel``, ``--microbatch``)."""
from __future__ import annotations

import argparse
import json

from ..errors import KilnError

DEVICES_HELP = ("compile for several devices, e.g. cpu:0,cpu:1 (the cores this process may use are dealt out to "
                "the CPU devices named; `kiln devices` lists them): a pipeline of stages or a replica per device, "
                "see --parallel; docs/devices.md")


def parse_device_memory(text: str) -> tuple[str, int]:
    """DEVICE=SIZE for --device-memory."""
    from .cli_compile import parse_size

    name, eq, size = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE (e.g. cpu:0=256MiB), got {text!r}")
    return name.strip(), parse_size(size)


def add_device_arguments(parser, with_parallel: bool = True) -> None:
    g = parser.add_argument_group("multi-device", "place the model on several devices (docs/devices.md)")
    g.add_argument("--devices", metavar="DEV,DEV,...", default=None, help=DEVICES_HELP)
    if not with_parallel:  # kiln dump: the placement, seen
        g.add_argument("--partition", metavar="FILE.svg", default=None,
                       help="with --devices: draw the placed graph, a lane per device, transfers with their bytes")
        g.add_argument("--explain-placement", action="store_true",
                       help="with --devices: say where each boundary between devices is and why (the balanced "
                            "cut, the min-byte cut, which was kept)")
    g.add_argument("--device-memory", action="append", type=parse_device_memory, default=[], metavar="DEV=SIZE",
                   help="the most a device may hold (its constants and arena), e.g. cpu:0=256MiB (repeatable; "
                        "default: an even share of the machine's memory); a model that fits no single device is "
                        "split over several")
    if with_parallel:
        g.add_argument("--parallel", choices=["auto", "pipeline", "data"], default="auto",
                       help="pipeline: consecutive stages on the devices, items streaming through them; data: the "
                            "whole model on every device, each taking its rows of the batch (needs a model with a "
                            "symbolic batch, fixed with --input-shape); auto (default): data where the batch can "
                            "be shared and a replica fits each device, else pipeline (the compile says why)")
        g.add_argument("--microbatch", type=int, default=None, metavar="N",
                       help="pipeline: compile the stages for N rows and stream the batch through them N rows at "
                            "a time (a symbolic batch that N divides)")


def device_options(args):
    """The ``DeviceOptions`` of the parsed arguments, or None without --devices."""
    from ..devices import DeviceOptions

    memory = dict(args.device_memory)
    if args.devices is None:
        if memory or getattr(args, "parallel", "auto") != "auto" or getattr(args, "microbatch", None) is not None:
            raise KilnError("--device-memory, --parallel and --microbatch go with --devices")
        return None
    return DeviceOptions.make(args.devices, memory, getattr(args, "parallel", "auto"),
                              getattr(args, "microbatch", None))


def report_compile(args, exe, timings: dict) -> int:
    """What ``kiln compile --devices`` prints: the mode and why, and each part."""
    from ..runtime.multidevice import part_memory

    doc = {"artifact": args.output, "model": exe.index["model"], "parallel": exe.parallel,
           "devices": exe.devices, "parts": exe.index["parts"], "placement": exe.placement,
           "compile_seconds": {k: round(v, 3) for k, v in timings.items()}}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"compiled {args.model} -> {args.output} for {len(exe.devices)} devices in {timings['total']:.2f} s")
    print(f"  {exe.placement['why']}")
    if "explain" in exe.placement:
        print("  " + exe.placement["explain"].replace("\n", "\n  "))
    for p in exe.parts:
        what = f"rows {p.rows[0]}:{p.rows[1]}" if p.rows else f"reads {len(p.inputs)}, returns {len(p.outputs)}"
        m = part_memory(p.exe)
        where = f"cores {','.join(map(str, p.cores))}" if p.cores else "GPU"
        print(f"  {p.name} on {p.device} ({where}): {len(p.exe.kernels)} kernel(s), {what}; weights "
              f"{m['weights_bytes'] / 2**20:.2f} MiB, arena {m['arena_bytes'] / 2**20:.2f} MiB")
    return 0


def inspect(args) -> int:
    """``kiln inspect`` of a multi-device artifact: the devices, and per part its kernels, weights,
    arena and the placement's estimate."""
    import os

    from ..runtime.artifact import read_manifest
    from ..runtime.multidevice import read_index

    index = read_index(args.artifact)
    manifests = {}
    for p in index["parts"]:
        where = os.path.join(args.artifact, p["path"])
        if p.get("kind", "cpu") == "cuda":
            with open(os.path.join(where, "cuda.json"), encoding="utf-8") as f:
                m = json.load(f)
            manifests[p["path"]] = (len(m["kernels"]), m["memory"])
        else:
            m = read_manifest(where)
            manifests[p["path"]] = (len(m.kernels), m.memory)
    stages = {s["device"]: s for s in index["placement"].get("stages", [])}
    if args.json:
        doc = dict(index)
        doc["parts"] = [dict(p, kernels=manifests[p["path"]][0], memory=manifests[p["path"]][1])
                        for p in index["parts"]]
        print(json.dumps(doc, indent=1))
        return 0
    print(f"artifact {args.artifact}: {index['model']}, {index['parallel']} over {len(index['devices'])} devices "
          f"(Kiln {index['kiln_version']})")
    for i in index["inputs"]:
        print(f"input    {i['name']}: {i['dtype']}{i['shape']}")
    for d in index["devices"]:
        print(f"device   {d['name']}: cores {','.join(map(str, d['cores']))}, memory {d['memory_bytes'] / 2**20:.0f} "
              f"MiB, {d['gflops']} GFLOP/s, {d['gbs']} GB/s (measured)")
    for p in index["parts"]:
        kernels, memory = manifests[p["path"]]
        rows = f", rows {p['rows'][0]}:{p['rows'][1]}" if p.get("rows") else ""
        est = stages.get(p["device"]) if not p.get("rows") else None
        estimate = (f"; {est['nodes']} node(s), estimated {est['estimated_ms']:.3f} ms" if est else "")
        print(f"part     {p['path']} on {p['device']}{rows}: {kernels} kernel(s), weights "
              f"{memory['weights_bytes'] / 2**20:.2f} MiB, arena {memory['arena_bytes'] / 2**20:.2f} MiB{estimate}")
        print(f"           reads {', '.join(p['inputs'])}; returns {', '.join(p['outputs'])}")
    print(f"why      {index['placement'].get('why', '')}")
    for cut in index["placement"].get("cuts", []):
        print(f"cut      {cut['devices'][0]} | {cut['devices'][1]} after {cut['kept_after']}: {cut['why']}")
    return 0


def add_commands(sub) -> None:
    d = sub.add_parser("devices", help="list the devices a model can be placed on",
                       description="List this machine's devices: one CPU device per core this process may use "
                                   "(a compile's --devices deals the cores out to the CPU devices it names) with "
                                   "its share of memory, and the CUDA GPUs numba.cuda sees. --measure also "
                                   "measures (or reads from the cache) each CPU device's GEMM speed and memory "
                                   "bandwidth, as the split-devices pass uses them.")
    d.add_argument("--measure", action="store_true", help="show each CPU device's measured GFLOP/s and GB/s")
    d.add_argument("--json", action="store_true", help="print the list as JSON")
    d.set_defaults(func=cmd_devices)


def cmd_devices(args) -> int:
    from ..devices import list_devices

    devs = list_devices()
    if args.measure:
        from ..profiling import machine_roofline

        roof = machine_roofline(1)
        for d in devs:
            if d["kind"] == "cpu":
                d["gflops"], d["gbs"] = round(roof["gflops"], 1), round(roof["gbs"], 1)
    if args.json:
        print(json.dumps(devs, indent=1))
        return 0
    for d in devs:
        if d["kind"] == "cpu":
            speed = f", {d['gflops']} GFLOP/s, {d['gbs']} GB/s" if "gflops" in d else ""
            print(f"{d['name']:<8} cpu   core {d['cores'][0]}, memory {d['memory_bytes'] / 2**30:.1f} GiB{speed}")
        else:
            print(f"{d['name']:<8} cuda  {d['model']} ({d['placement']})")
    if not any(d["kind"] == "cuda" for d in devs):
        print("(no CUDA device: numba.cuda sees none here)")
    return 0
