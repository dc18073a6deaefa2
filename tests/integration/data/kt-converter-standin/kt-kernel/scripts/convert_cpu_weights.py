"""A stand-in for kt-kernel's converter (kt-kernel/scripts/convert_cpu_weights.py), which no wheel or
sdist ships and this suite cannot fetch: it takes the converter's arguments, writes the layout the real
one writes (an index of blk.L.ffn_{gate,up,down}_exps.E.numa.N.{weight,scale} keys, one shard per MoE
layer, config.json; zero-filled) and prints what it found in its container, so the test checks
moe-stack's `docker run` of it: mounts, user, /dev/shm, network, the staging directory and the rename.
The real converter ran through the same plan on the H200 (bench/results/kt-amx-2026-12-01).
A config.json with `moe_stack_standin_fail` makes it fail as the real one does (a message, exit 1)."""

import argparse
import json
import os
import socket
import struct
import sys

parser = argparse.ArgumentParser()
for flag in ("--input-path", "--input-type", "--output", "--quant-method"):
    parser.add_argument(flag, required=True)
parser.add_argument("--cpuinfer-threads", type=int, required=True)
parser.add_argument("--threadpool-count", type=int, required=True)
args = parser.parse_args()
with open(os.path.join(args.input_path, "config.json")) as handle:
    config = json.load(handle)
shm = os.statvfs("/dev/shm")
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    network = "reachable"
except OSError:
    network = "none"
print(
    json.dumps(
        {
            "uid": os.getuid(),
            "gid": os.getgid(),
            "shm_bytes": shm.f_blocks * shm.f_frsize,
            "network": network,
            "variant": os.environ.get("KT_KERNEL_CPU_VARIANT"),
            "args": sys.argv[1:],
            "model_files": sorted(os.listdir(args.input_path)),
        }
    ),
    flush=True,
)
if config.get("moe_stack_standin_fail"):
    print(f"Error during conversion: {config['moe_stack_standin_fail']}")
    sys.exit(1)
weight_map = {}
layers = config["num_hidden_layers"]
for layer in range(layers):
    shard = f"model-{layer + 1:05d}-of-{layers:05d}.safetensors"
    header, offset = {}, 0
    for proj in ("gate", "up", "down"):
        for expert in range(config["num_experts"]):
            for pool in range(args.threadpool_count):
                for part, size in (("weight", 16), ("scale", 4)):
                    name = f"blk.{layer}.ffn_{proj}_exps.{expert}.numa.{pool}.{part}"
                    header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
                    weight_map[name] = shard
                    offset += size
    encoded = json.dumps(header).encode()
    with open(os.path.join(args.output, shard), "wb") as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))
with open(os.path.join(args.output, "model.safetensors.index.json"), "w") as out:
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, out)
with open(os.path.join(args.output, "config.json"), "w") as out:
    json.dump(config, out)
print("Conversion completed successfully!")
