"""PyTorch's own distributed checkpoint on the state dict of checkpoint_benchmark.cpp, for the
comparison with dtensor-cpp's save and load in PyTorch's format (save_dcp, load_dcp there).

    python benchmarks/dcp_pytorch_bench.py [ITERS]

4 Gloo processes, each holding a quarter (Shard(0)) of 4 float tensors [3584, 4096] and 256
[32, 1024] (256 MiB in all), save with dcp.save (FileSystemWriter without fsync, as the C++
figures run with sync_files = false) into $TMPDIR, then load into the same layout with dcp.load.
Then the same as Hugging Face safetensors with HuggingFaceStorageWriter(save_distributed=True)
(sync_files off as well), without and with enable_consolidation, and dcp.load of the shards
with HuggingFaceStorageReader.
Rank 0 prints the median of ITERS (default 5) timed iterations after one untimed one:
"dcp_save_ms <ms>", "dcp_load_ms <ms>", "hf_save_ms <ms>", "hf_save_consolidated_ms <ms>" and
"hf_load_ms <ms>".
"""

import os
import shutil
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import (
    FileSystemReader,
    FileSystemWriter,
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

WORLD = 4


def state(mesh):
    sd = {}
    for i in range(4):
        sd[f"large.{i}"] = distribute_tensor(torch.full((3584, 4096), float(i)), mesh, [Shard(0)])
    for i in range(256):
        sd[f"small.{i}"] = distribute_tensor(torch.full((32, 1024), float(i)), mesh, [Shard(0)])
    return sd


def median_ms(fn, iters):
    fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def rank_main(rank, port, base, iters):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    sd = state(mesh)
    path = os.path.join(base, "ckpt")
    save = median_ms(lambda: dcp.save(sd, storage_writer=FileSystemWriter(path, sync_files=False, overwrite=True)), iters)
    dest = state(mesh)
    load = median_ms(lambda: dcp.load(dest, storage_reader=FileSystemReader(path)), iters)

    def hf_writer(out, consolidate):
        w = HuggingFaceStorageWriter(out, save_distributed=True, enable_consolidation=consolidate)
        w.sync_files = False  # its constructor takes no sync_files; FileSystemWriter's default is on
        return w

    hf = os.path.join(base, "hf")
    hf_save = median_ms(lambda: dcp.save(sd, storage_writer=hf_writer(hf, False)), iters)
    hfc = os.path.join(base, "hfc")
    hf_save_consolidated = median_ms(lambda: dcp.save(sd, storage_writer=hf_writer(hfc, True)), iters)
    hf_load = median_ms(lambda: dcp.load(dest, storage_reader=HuggingFaceStorageReader(hf)), iters)
    if rank == 0:
        print(f"dcp_save_ms {save:.1f}\ndcp_load_ms {load:.1f}\nhf_save_ms {hf_save:.1f}\n"
              f"hf_save_consolidated_ms {hf_save_consolidated:.1f}\nhf_load_ms {hf_load:.1f}", flush=True)
    dist.destroy_process_group()


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    base = tempfile.mkdtemp(prefix="dcp_pytorch_bench_")
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(rank_main, args=(port, base, iters), nprocs=WORLD, start_method="fork")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
