"""PyTorch's side of the DCP interop tests (suites/checkpoint/dcp_interop_test.cpp).

    python dcp_interop.py save OUT_DIR WORLD

saves, with torch.distributed.checkpoint on a Gloo world of WORLD processes, a state dict
of DTensors in the layouts PyTorch's training stacks write into OUT_DIR/ckpt, and the full
value of every entry into OUT_DIR/expected.json (the test's reference: PyTorch's own numbers).
The entries (WORLD >= 2; the 2-D ones need WORLD == 4):
  - "tp.w": Shard(0) of a float32 [9, 6] (uneven when WORLD does not divide 9);
  - "tp.v": Shard(1) of a bfloat16 [4, 10];
  - "rep": Replicate of a float64 [5]; "plain": a plain int64 [7] tensor;
  - "step": an int, "name": a str;
  - "model.*", "optim.*": an MLP (10 -> 16 -> 10) under FSDP2 (fully_shard, Shard(0) on a 1-D
    mesh) after one Adam step, through get_state_dict (parameters, exp_avg, exp_avg_sq, step,
    param_groups); its parameters after a second step go to OUT_DIR/after.json;
  - "2d.*" (WORLD == 4): the same MLP under TP (colwise, rowwise) on a 2x2 mesh's "tp" dim and
    FSDP2 on its "dp" dim, whose weights are _StridedShard on dp and Shard on tp.
The floating-point tensor entries are also saved as Hugging Face safetensors, sharded by every rank and
consolidated (HuggingFaceStorageWriter with save_distributed=True, enable_consolidation=True,
the keys alternating between two files), into OUT_DIR/hf, where this PyTorch has that writer.
Prints one line, "saved N entries", and exits 0.

    python dcp_interop.py load CKPT_DIR EXPECTED_JSON WORLD

loads, with dcp.load on a Gloo world of WORLD processes, the checkpoint dtensor-cpp saved in
PyTorch's format (SaveOptions::format = kPyTorchDcp) into DTensors of other placements (entry i
of the expected values: Shard(0), Shard(last dim), Replicate, in turn; 0-dim tensors plain) and
None placeholders for objects, and compares every value with EXPECTED_JSON (the same form as
above, written by the C++ side). Prints "checked N entries" and exits 0, or names every
mismatch and exits 1.

    python dcp_interop.py resume CKPT_DIR AFTER_JSON WORLD

resumes training from "model.*" and "optim.*" of a checkpoint dtensor-cpp saved in PyTorch's
format (its optimizer state in PyTorch's layout: StateDictOptions::pytorch_layout): dcp.load
and set_state_dict into the FSDP2 MLP and its Adam on WORLD Gloo processes, one step on the
batch of train_step, and compares the parameters with AFTER_JSON ({"model.<name>": the values
of the C++ side after its own step}). Prints "resumed N parameters".

    python dcp_interop.py load-hf HF_DIR EXPECTED_JSON WORLD

checks a Hugging Face save of dtensor-cpp (SaveOptions::format = kHuggingFace with
enable_consolidation) the same way: dcp.load with HuggingFaceStorageReader reads its shards
(HF_DIR/sharded) into other placements, and safetensors' load_file reads the consolidated
files its index names; both must hold EXPECTED_JSON's tensors.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    """The shape of dtensor-cpp's models::MLPModule (and of PyTorch's MLPModule in its tests)."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 16)
        self.net2 = nn.Linear(16, 10)

    def forward(self, x):
        return self.net2(torch.relu(self.net1(x)))


# FSDP2 runs on the CPU from PyTorch 2.7 (Debian 13's 2.6 lacks the CPU streams' record_event
# it needs): before, fsdp_mlp lays the parameters out as FSDP2 does (Shard(0)) by hand, and the
# 2-D model is left out.
FSDP2_ON_CPU = hasattr(torch.cpu.Stream, "record_event")


def train_step(model, opt):
    """One Adam step on a fixed batch (the C++ side takes the same: dcp_interop_test.cpp)."""
    x = torch.arange(40, dtype=torch.float32).reshape(4, 10) / 40
    if getattr(model, "mesh", None) is not None:
        x = DTensor.from_local(x, model.mesh, [Replicate()])
    out = model(x)
    (out.full_tensor() if isinstance(out, DTensor) else out).sum().backward()
    opt.step()
    opt.zero_grad()


def trained(model):
    """Adam after one step; returns it and the (model, optimizer) state dicts."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train_step(model, opt)
    return opt, get_state_dict(model, opt)


def fsdp_mlp(mesh):
    model = MLP()
    model.mesh = None
    if FSDP2_ON_CPU:
        fully_shard(model.net1, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    for layer in (model.net1, model.net2):
        for name, p in list(layer.named_parameters()):
            layer.register_parameter(name, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
    model.mesh = mesh
    return model


def parameters_reference(model):
    return {f"model.{k}": reference(v) for k, v in model.named_parameters()}


def flat(prefix, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and any(isinstance(v, (dict, list, torch.Tensor)) for v in value):
        # As DCP's flatten_state_dict: a list is traversed when it holds containers or tensors.
        for i, v in enumerate(value):
            flat(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = value


def reference(value):
    if isinstance(value, DTensor):
        value = value.full_tensor()
    if isinstance(value, torch.Tensor):
        return {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "values": value.detach().to(torch.float64).flatten().tolist()}
    return {"object": value}


def has_hf_storage():
    """Whether this PyTorch has the Hugging Face storage writer and reader (Debian 13's 2.6 has
    not) and the safetensors package they use."""
    try:
        from torch.distributed.checkpoint import HuggingFaceStorageWriter  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError:
        return False
    return True


def init_world(rank, world, port):
    """Joins the Gloo world; returns its 1-D mesh."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def leave_world(code):
    """Every rank waits for the others, then ends the process with `code`, skipping the
    interpreter's teardown.

    Not dist.destroy_process_group() or a normal return: either can drop the last reference to
    the ProcessGroupGloo on this thread, whose destructor joins its worker threads while holding
    the GIL. A worker still releasing a finished collective's tensors (which have Python objects)
    waits for the GIL, so the two wait on each other. PyTorch 2.6 (Debian 13's python3-torch)
    deadlocks so about once in 12 runs of this script; os._exit leaves nothing to destroy."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def finish(rank, bad, summary):
    """Rank 0 prints every mismatch and `summary`; every rank leaves the world, failing on a mismatch."""
    if rank == 0:
        for b in bad:
            print("MISMATCH", b, flush=True)
        print(summary, flush=True)
    leave_world(1 if bad else 0)


def rank_main(rank, world, out_dir, port):
    mesh = init_world(rank, world, port)
    torch.manual_seed(0)
    sd = {
        "tp.w": distribute_tensor(torch.arange(54, dtype=torch.float32).reshape(9, 6) * 0.5, mesh, [Shard(0)]),
        "tp.v": distribute_tensor(torch.arange(40).reshape(4, 10).to(torch.bfloat16), mesh, [Shard(1)]),
        "rep": distribute_tensor(torch.linspace(-1, 1, 5, dtype=torch.float64), mesh, [Replicate()]),
        "plain": torch.arange(7) * 3,
        "step": 42,
        "name": "dtensor-cpp",
    }
    fsdp = fsdp_mlp(mesh)
    fsdp_opt, (model_sd, optim_sd) = trained(fsdp)
    sd["model"] = model_sd
    sd["optim"] = optim_sd
    if world == 4 and FSDP2_ON_CPU:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp = MLP()
        parallelize_module(tp, mesh2["tp"], {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
        fully_shard(tp, mesh=mesh2["dp"])
        _, (model2, optim2) = trained(tp)
        sd["2d"] = {"model": model2, "optim": optim2}
    dcp.save(sd, checkpoint_id=os.path.join(out_dir, "ckpt"))
    entries = {}
    flat("", sd, entries)
    expected = {k: reference(v) for k, v in entries.items()}
    # Floating-point ones: PyTorch's consolidation sizes elements with torch.finfo, which
    # raises for integer dtypes.
    tensors = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    mapping = {k: 1 + i % 2 for i, k in enumerate(sorted(tensors))}
    if has_hf_storage():
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(
            os.path.join(out_dir, "hf"), fqn_to_index_mapping=mapping, save_distributed=True,
            enable_consolidation=True))
    # The FSDP2 model's parameters after a second step: what resuming from the checkpoint gives.
    train_step(fsdp, fsdp_opt)
    after = parameters_reference(fsdp)
    if rank == 0:
        with open(os.path.join(out_dir, "after.json"), "w") as f:
            json.dump(after, f)
        with open(os.path.join(out_dir, "expected.json.partial"), "w") as f:
            json.dump(expected, f)
        os.rename(os.path.join(out_dir, "expected.json.partial"), os.path.join(out_dir, "expected.json"))
        print(f"saved {len(expected)} entries", flush=True)
    leave_world(0)


def destinations(expected, mesh):
    """Zeros for each entry of `expected`, in placements other than the saver's, in turn."""
    sd = {}
    for i, (key, e) in enumerate(expected.items()):
        if "values" not in e:
            sd[key] = None
            continue
        zeros = torch.zeros(e["shape"], dtype=getattr(torch, e["dtype"]))
        if zeros.dim() == 0:
            sd[key] = zeros
        else:
            sd[key] = distribute_tensor(zeros, mesh, [[Shard(0)], [Shard(zeros.dim() - 1)], [Replicate()]][i % 3])
    return sd


def mismatches(sd, expected, how):
    bad = []
    for key, e in expected.items():
        # Through JSON, as the expected values came: tuples are lists there.
        got = json.loads(json.dumps(reference(sd[key])))
        want = dict(e)
        if got != want:
            bad.append(f"{how}: {key}: loaded {got}, expected {want}")
    return bad


def load_main(rank, world, ckpt, expected_path, port, hf):
    mesh = init_world(rank, world, port)
    with open(expected_path) as f:
        expected = json.load(f)
    sd = destinations(expected, mesh)
    if hf:
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        dcp.load(sd, storage_reader=HuggingFaceStorageReader(os.path.join(ckpt, "sharded")))
        bad = mismatches(sd, expected, "shards")
        from safetensors.torch import load_file
        with open(os.path.join(ckpt, "model.safetensors.index.json")) as f:
            index = json.load(f)
        full = {}
        for name in sorted(set(index["weight_map"].values())):
            full.update(load_file(os.path.join(ckpt, name)))
        bad += mismatches(full, expected, "consolidated")
    else:
        dcp.load(sd, checkpoint_id=ckpt)
        bad = mismatches(sd, expected, "dcp")
    finish(rank, bad, f"checked {len(expected)} entries")


def resume_main(rank, world, ckpt, after_path, port):
    """Resumes training from a checkpoint of model.* and optim.* (PyTorch's layout): loads it into
    an FSDP2 MLP and its Adam with dcp.load and set_state_dict, takes one step, and compares the
    parameters with AFTER_JSON."""
    mesh = init_world(rank, world, port)
    model = fsdp_mlp(mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model_sd, optim_sd = get_state_dict(model, opt)
    sd = {"model": model_sd, "optim": optim_sd}
    dcp.load(sd, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    train_step(model, opt)
    with open(after_path) as f:
        after = json.load(f)
    got = parameters_reference(model)
    bad = []
    for key, want in after.items():
        g = got.get(key)
        if g is None or g["shape"] != want["shape"] or not torch.allclose(
                torch.tensor(g["values"]), torch.tensor(want["values"]), rtol=1e-5, atol=1e-6):
            bad.append(f"{key}: after resuming {g}, expected {want}")
    finish(rank, bad, f"resumed {len(after)} parameters")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "save":
        out_dir, world = sys.argv[2], int(sys.argv[3])
        os.makedirs(out_dir, exist_ok=True)
        mp.start_processes(rank_main, args=(world, out_dir, free_port()), nprocs=world, start_method="fork")
    elif len(sys.argv) == 5 and sys.argv[1] in ("load", "load-hf"):
        ckpt, expected, world = sys.argv[2], sys.argv[3], int(sys.argv[4])
        mp.start_processes(load_main, args=(world, ckpt, expected, free_port(), sys.argv[1] == "load-hf"), nprocs=world,
                           start_method="fork")
    elif len(sys.argv) == 5 and sys.argv[1] == "resume":
        ckpt, after, world = sys.argv[2], sys.argv[3], int(sys.argv[4])
        mp.start_processes(resume_main, args=(world, ckpt, after, free_port()), nprocs=world, start_method="fork")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
