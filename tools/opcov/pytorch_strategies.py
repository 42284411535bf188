#!/usr/bin/env python3
"""Runs the op samples that `strategy_discovery --dump-samples DIR` exports through PyTorch's own
DTensor and records, for every (sample, input placement combination), what PyTorch does with it:
whether it supports it, the output placements it gives, how many collectives it issues and
whether the values are right versus the single-device op.

Usage:
  pytorch_strategies.py DIR --out FILE [--ops aten::mm,aten::add.Tensor] [--timeout 60]
                        [--limit-combinations N] [--part K/N]
  pytorch_strategies.py --self-test

How: one process simulates the whole world. A fake process group (backend "fake" from
torch.testing._internal.distributed.fake_pg, a FakeStore, rank 0 of `ranks`) lets a 1-D
DeviceMesh be made; inside torch.distributed._local_tensor.LocalTensorMode every DTensor's local
tensor is a LocalTensor holding one tensor per rank and every collective is carried out on those
per-rank tensors: results are exact, no thread and no communication. Inputs R and S(d) come from
distribute_tensor, P(kind) from DTensor.from_local of per-rank pieces (partial_pieces) made
adversarial, so that an op that is not linear cannot pass a Partial through by luck; a
combination with a Partial input runs a second time on the complementary checkerboard and is
"ok" only if both runs are. The reference is the single-device op on what the inputs stand for
(a Partial's pieces reduced, which differs from the sample's value by rounding).
"redistributions" is CommDebugMode's get_total_counts() over the op call alone: the c10d /
functional collectives DTensor issues, which LocalTensorMode then simulates (making the inputs
and full_tensor() of the outputs are not counted). Tolerances: the sample's, else
torch.testing's default for the loosest dtype among the output's and the inputs'. A combination
with a Partial input that is off is run again in float64 (complex128) and counted "ok" (with a
message) when right there: the pieces' offsets can make a right strategy's rounding exceed the
tolerance (float16 mul, float32 bmm). Input DTensors are reused between a sample's
combinations unless the op writes an argument. --limit-combinations caps the combinations run
per sample (evenly spaced over the sample's list); --timeout bounds the seconds spent on one
sample (SIGALRM; it cannot interrupt one long call into C++): the combination running then is
an "error", the rest of the sample "skipped".

Input: DIR/index.json `{"ranks": R, "samples": N, "files": [n, ...]}` and DIR/<n>.pt for each n
of "files" (without "files": every n < N; tools/strategy_discovery --dump-samples writes the
samples it examined, numbered over the whole op database), each a dict with
"op" ("aten::add.Tensor"; no overload = default), "variant", "args" (a list of
(name, value, kwarg_only) in schema order; ScalarType / Layout / MemoryFormat given as ints),
"combinations" (lists of "R" | "S(d)" | "P(sum|avg|min|max)", one per tensor slot: each Tensor
argument and each Tensor element of a list argument, in order, None skipped), "rtol", "atol"
(None: torch.testing's default for the dtype).

Output (JSON lines): a header {"torch", "ranks", "world": "LocalTensorMode"} (plus
"unavailable": why, and nothing else, when this torch has no LocalTensorMode), then per
combination {"sample", "op", "variant", "inputs", "status", "outputs", "redistributions",
"message", "max_error", "reproducer"} (empty optional fields left out). status: "ok" (every
output equals the single-device one within tolerance), "wrong" (a value, shape or dtype differs;
max_error and a self-contained Python reproducer given), "unsupported" (PyTorch's DTensor
raised; message = its first line), "skipped" (a Partial input of a non-floating tensor, or the
sample's time ran out), "error" (the single-device op failed, an output's full_tensor() failed
-- outputs then still given --, or something else unexpected). outputs: "R", "S(d)", "_S(d, sf)"
(_StridedShard), "P(op)" per DTensor output (a Partial subclass such as embedding's _MaskPartial
as its reduce op: "P(sum)"), "-" for a non-DTensor one. A max_error that is not finite is
written as a string ("nan").
Exit status: 0 when the run completed, 2 for a bad DIR, 1 when --self-test fails.
"""
import argparse
import contextlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings

try:
    import torch
except ImportError:  # reported in the header line
    torch = None

# ATen's ScalarType enum order (the ints the C++ tool writes).
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
                6: "float32", 7: "float64", 8: "complex32", 9: "complex64", 10: "complex128",
                11: "bool", 15: "bfloat16"}
LAYOUTS = {0: "strided", 1: "sparse_coo", 2: "_mkldnn", 3: "sparse_csr"}
MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last",
                  3: "channels_last_3d"}


class SampleTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so that no `except Exception` inside torch eats it."""


class Skip(Exception):
    pass


class Alarm:
    """A per-sample deadline (SIGALRM) that raises SampleTimeout only inside guarded(), so that
    it never lands in the middle of writing a record."""

    def __init__(self):
        self.armed = self.expired = False
        signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum, frame):
        self.expired = True
        if self.armed:
            raise SampleTimeout()

    def start(self, seconds):
        self.expired = False
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def stop(self):
        signal.setitimer(signal.ITIMER_REAL, 0)

    @contextlib.contextmanager
    def guarded(self):
        if self.expired:
            raise SampleTimeout()
        self.armed = True
        try:
            yield
        finally:
            self.armed = False


def partial_pieces(v, kind, ranks, slot, shift=0):
    """Per-rank pieces (a dict rank -> tensor) whose `kind` reduction is v: for sum, rank 0 holds
    v/ranks + c and the others v/ranks - c/(ranks-1), c = (|v|+1) * (+-1 on a checkerboard of
    v's coordinates, shifted by the argument's slot and by `shift`); avg: those times ranks;
    min/max: the rank picked by the checkerboard holds v, the others v moved away from the
    winning side, by 2*range+1 (shift 0) or by (|v|+1)/2 (shift 1, the complementary pass)."""
    coords = torch.zeros(v.shape, dtype=torch.int64)
    for d, n in enumerate(v.shape):
        shape = [1] * v.dim()
        shape[d] = n
        coords = coords + torch.arange(n).reshape(shape)
    coords = coords + slot + shift
    if kind in ("sum", "avg"):
        sign = torch.where(coords % 2 == 0, 1.0, -1.0).to(v.real.dtype if v.is_complex() else v.dtype)
        c = (v.abs() + 1) * sign
        scale = ranks if kind == "avg" else 1
        return {r: (v / ranks + (c if r == 0 else -c / (ranks - 1))) * scale for r in range(ranks)}
    if shift % 2 == 0:
        finite = v[torch.isfinite(v)]
        away = 2 * (float(finite.max() - finite.min()) if finite.numel() else 0.0) + 1
    else:
        away = (v.abs() + 1) / 2
    away = away if kind == "min" else -away
    return {r: torch.where(coords % ranks == r, v, v + away) for r in range(ranks)}


def reduce_pieces(pieces, kind):
    """The global value that a Partial(kind) of these pieces stands for, as its all-reduce gives it."""
    vals = [pieces[r] for r in sorted(pieces)]
    out = vals[0]
    for x in vals[1:]:
        out = {"sum": torch.add, "avg": torch.add, "min": torch.minimum, "max": torch.maximum}[kind](out, x)
    return out / len(vals) if kind == "avg" else out


def placement_str(p):
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    if isinstance(p, _StridedShard):
        return f"_S({p.dim}, {p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return f"P({p.reduce_op})"
    return str(p)


def resolve_op(name):
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def canonical_op(name):
    return name if "." in name.partition("::")[2] else name + ".default"


def convert_args(op, args):
    """Turns the enum ints of ScalarType / Layout / MemoryFormat arguments into torch objects."""
    # real_type: `type` says int for these enums
    types = {a.name: str(getattr(a, "real_type", a.type)) for a in op._schema.arguments}
    out = []
    for name, value, kwarg_only in args:
        t = types.get(name, "")
        if isinstance(value, int) and not isinstance(value, bool):
            for key, table in (("ScalarType", SCALAR_TYPES), ("Layout", LAYOUTS),
                               ("MemoryFormat", MEMORY_FORMATS)):
                if key in t and value in table:
                    value = getattr(torch, table[value])
        out.append((name, value, bool(kwarg_only)))
    return out


def map_tensors(args, fn):
    """args with every tensor slot replaced by fn(slot index, tensor), in slot order."""
    slot = [0]

    def one(x):
        if isinstance(x, torch.Tensor):
            slot[0] += 1
            return fn(slot[0] - 1, x)
        return x

    return [(n, [one(x) for x in v] if isinstance(v, (list, tuple)) else one(v), k)
            for n, v, k in args]


def tensors_of(args):
    found = []
    map_tensors(args, lambda i, t: found.append(t))
    return found


def call(op, args):
    return op(*[v for _, v, k in args if not k], **{n: v for n, v, k in args if k})


def clone_args(args):
    return map_tensors(args, lambda i, t: t.clone())


def leaves(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def tolerances(dtypes, rtol, atol):
    """The sample's tolerances, or else torch.testing's defaults for the loosest of `dtypes`
    (the output's and the inputs': a float32 input summed into a float64 output carries
    float32 rounding)."""
    from torch.testing._comparison import default_tolerances
    d_rtol, d_atol = map(max, zip(*(default_tolerances(d) for d in dtypes)))
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def compare(got, want, rtol, atol, input_dtypes=()):
    """(max error, problem or None) of one output, got being one rank's value."""
    if not isinstance(want, torch.Tensor):
        return (0.0, None) if got == want else (None, f"value {got!r} vs {want!r}")
    if not isinstance(got, torch.Tensor):
        return None, f"got {type(got).__name__}, expected a tensor"
    if got.shape != want.shape or got.dtype != want.dtype:
        return None, f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if want.numel() == 0:
        return 0.0, None
    g, w = got.detach(), want.detach()
    if w.is_complex() or w.is_floating_point():
        r, a = tolerances([w.dtype, *(d for d in input_dtypes if d.is_floating_point or d.is_complex)],
                          rtol, atol)
        close = torch.isclose(g, w, rtol=r, atol=a, equal_nan=True)
    else:
        close = g == w
    diff = (g.to(torch.complex128 if w.is_complex() else torch.float64)
            - w.to(torch.complex128 if w.is_complex() else torch.float64)).abs()
    diff = torch.where(close, torch.zeros_like(diff), diff)
    err = float(diff.max())
    return err, (None if bool(close.all()) else "values differ")


class World:
    """The fake process group, the mesh and LocalTensorMode for `ranks` simulated ranks."""

    def __init__(self, ranks):
        import torch.distributed as dist
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers backend "fake")
        from torch._C._distributed_c10d import FakeStore
        from torch.distributed._local_tensor import LocalTensorMode
        from torch.distributed.device_mesh import init_device_mesh
        self.ranks = ranks
        self.mode = lambda: LocalTensorMode(ranks)
        if not dist.is_initialized():
            dist.init_process_group(backend="fake", rank=0, world_size=ranks, store=FakeStore())
        with self.mode():
            self.mesh = init_device_mesh("cpu", (ranks,))
        self.cache, self.reuse = {}, False

    def begin_sample(self, op):
        """Input DTensors are reused between a sample's combinations (making them is half the
        time) unless the op writes an argument."""
        self.cache.clear()
        self.reuse = not any(a.alias_info is not None and a.alias_info.is_write
                             for a in op._schema.arguments)

    def prepare(self, slot, t, spec, shift):
        """Outside the mode: what is needed to make slot's DTensor (pieces for a Partial)."""
        if spec.startswith("P("):
            if not (t.is_floating_point() or t.is_complex()):
                raise Skip(f"P input of a {t.dtype} tensor")
            if t.is_complex() and spec in ("P(min)", "P(max)"):
                raise Skip(f"{spec} input of a complex tensor")
            return partial_pieces(t, spec[2:-1], self.ranks, slot, shift)
        return None

    def dtensor(self, t, spec, pieces, key):
        """Inside the mode: the DTensor of global value t with placement spec."""
        if self.reuse and key in self.cache:
            return self.cache[key]
        self.cache[key] = d = self.make_dtensor(t, spec, pieces)
        return d

    def make_dtensor(self, t, spec, pieces):
        from torch.distributed._local_tensor import LocalTensor
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
        if spec == "R":
            return distribute_tensor(t, self.mesh, [Replicate()])
        m = re.fullmatch(r"S\((-?\d+)\)", spec)
        if m:
            return distribute_tensor(t, self.mesh, [Shard(int(m.group(1)))])
        if spec.startswith("P("):
            return DTensor.from_local(LocalTensor(pieces), self.mesh, [Partial(spec[2:-1])],
                                      run_check=False, shape=t.shape, stride=t.stride())
        raise ValueError(f"unknown placement {spec!r}")


def run_combination(world, op, args, expected, combo, rtol, atol):
    """One combination's record fields (status, outputs, redistributions, ...). With a Partial
    input it runs twice, the second time on the complementary checkerboard, and is "ok" only
    if both are; "_shift" tells the reproducer which pass went wrong."""
    first = None
    for shift in (0, 1) if any(s.startswith("P(") for s in combo) else (0,):
        rec = run_pass(world, op, args, expected, combo, rtol, atol, shift)
        if rec["status"] == "wrong" and rounding_only(world, op, args, combo, rtol, atol, shift):
            rec = {**rec, "status": "ok", "message": f"off by {rec['max_error']:.3g}, right in float64 "
                   "(rounding of the Partial pieces)"}
            rec.pop("max_error")
        if rec["status"] != "ok":
            return {**rec, "_shift": shift}
        first = first or rec
    return first


def rounding_only(world, op, args, combo, rtol, atol, shift):
    """Whether a combination with a Partial input that came out wrong is right in float64
    (complex128): the pieces' offsets (|v| + 1) can make a right strategy's rounding error
    exceed the dtype's tolerance (bmm of R and P(sum) in float32: 4e-5 against atol 1e-5)."""
    wider = {torch.float16: torch.float64, torch.bfloat16: torch.float64, torch.float32: torch.float64,
             torch.complex32: torch.complex128, torch.complex64: torch.complex128}
    if not any(s.startswith("P(") for s in combo) or not any(t.dtype in wider for t in tensors_of(args)):
        return False
    wide = map_tensors(args, lambda i, t: t.to(wider[t.dtype]) if t.dtype in wider else t)
    try:
        torch.manual_seed(0)
        expected = call(op, clone_args(wide))
        return run_pass(world, op, wide, expected, combo, rtol, atol, shift)["status"] == "ok"
    except Exception:
        return False


def run_pass(world, op, args, expected, combo, rtol, atol, shift):
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    args = clone_args(args)
    globals_ = tensors_of(args)
    if len(globals_) != len(combo):
        return {"status": "error", "message": f"{len(combo)} placements for {len(globals_)} tensors"}
    try:
        pieces = [world.prepare(i, t, s, shift) for i, (t, s) in enumerate(zip(globals_, combo))]
    except Skip as e:
        return {"status": "skipped", "message": str(e)}
    # The reference is the op on what the inputs stand for: a Partial's reduced pieces differ
    # from the sample's value by rounding, which in float16 would exceed the tolerance.
    effective = [t if p is None else reduce_pieces(p, s[2:-1]) for t, p, s in zip(globals_, pieces, combo)]
    if any(e is not t for e, t in zip(effective, globals_)):
        torch.manual_seed(0)
        expected = call(op, map_tensors(args, lambda i, t: effective[i].clone()))
    torch.manual_seed(0)
    with world.mode():
        dargs = map_tensors(args, lambda i, t: world.dtensor(t, combo[i], pieces[i], (i, combo[i], shift, t.dtype)))
        try:
            with CommDebugMode() as comms:
                out = call(op, dargs)
        except Exception as e:  # PyTorch's DTensor refused it
            return {"status": "unsupported", "message": first_line(e)}
        got = [(placement_str(o.placements[0]), o) if isinstance(o, DTensor) else ("-", o) for o in leaves(out)]
        rec = {"outputs": [p for p, _ in got], "redistributions": comms.get_total_counts()}
        for k, (p, o) in enumerate(got):
            if p != "-":
                try:
                    got[k] = (p, o.full_tensor())
                except Exception as e:  # e.g. P(max) of a complex tensor cannot be reduced
                    return {**rec, "status": "error", "message": f"full_tensor() of output {k} ({p}): {first_line(e)}"}
    want = leaves(expected)
    if len(want) != len(got):
        return {**rec, "status": "wrong", "message": f"{len(got)} outputs, expected {len(want)}"}
    worst, problems = 0.0, []
    for k, ((_, g), w) in enumerate(zip(got, want)):
        per_rank = getattr(g, "_local_tensors", None) or {0: g}  # LocalTensor: every rank's copy
        for r, value in sorted(per_rank.items()):
            err, problem = compare(value, w, rtol, atol, [t.dtype for t in globals_])
            if err is not None:
                worst = max(worst, err) if err == err else err
            if problem:
                problems.append(f"output {k} rank {r}: {problem}")
    if not problems:
        return {**rec, "status": "ok"}
    message = "; ".join(problems[:3]) + (" (complementary checkerboard)" if shift else "")
    return {**rec, "status": "wrong", "message": message, "max_error": worst}


def first_line(e):
    """The exception's first line, and its cause's when that says more (DTensor's sharding
    propagation wraps "aten.masked_select.default" around a DynamicOutputShapeException)."""
    text = str(e).strip().splitlines()
    line = f"{type(e).__name__}: {text[0] if text else ''}"
    if e.__cause__ is not None:
        cause = str(e.__cause__).strip().splitlines()
        said = ": " + cause[0] if cause and cause[0] not in line else ""
        if said or type(e.__cause__) is not type(e):
            line += f" (from {type(e.__cause__).__name__}{said})"
    return line[:400]


def literal(v):
    """Python source of a non-tensor argument value."""
    if isinstance(v, float) and v != v:
        return "float('nan')"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return f"float('{v}')"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(literal(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    return repr(v)


def reproducer(ranks, op_name, args, combo, shift):
    """A self-contained snippet that runs the combination on random values of the same shapes."""
    lines = ["import torch, torch.distributed as dist",
             "import torch.testing._internal.distributed.fake_pg  # registers backend 'fake'",
             "from torch._C._distributed_c10d import FakeStore",
             "from torch.distributed._local_tensor import LocalTensor, LocalTensorMode",
             "from torch.distributed.device_mesh import init_device_mesh",
             "from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor",
             f"R = {ranks}",
             "if not dist.is_initialized():",
             "    dist.init_process_group('fake', rank=0, world_size=R, store=FakeStore())",
             "", inspect.getsource(partial_pieces), inspect.getsource(reduce_pieces), "torch.manual_seed(0)"]
    for i, t in enumerate(tensors_of(args)):
        shape, dt = list(t.shape), str(t.dtype)
        if t.is_floating_point() or t.is_complex():
            make = f"torch.randn({shape}, dtype={dt})"
        elif t.numel() <= 64:
            make = f"torch.tensor({t.tolist()}, dtype={dt})"
        elif t.dtype == torch.bool:
            make = f"torch.randint(0, 2, {shape}).bool()"
        else:
            make = f"torch.randint({int(t.min())}, {int(t.max()) + 1}, {shape}, dtype={dt})"
        lines.append(f"t{i} = {make}")
        if combo[i].startswith("P("):
            lines.append(f"p{i} = partial_pieces(t{i}, {combo[i][2:-1]!r}, R, {i}, {shift})")
            lines.append(f"e{i} = reduce_pieces(p{i}, {combo[i][2:-1]!r})  # what the Partial stands for")

    def call_src(name_of):
        src = map_tensors(args, lambda i, t: Src(name_of(i)))
        pos = [literal(v) for _, v, k in src if not k]
        kw = [f"{n}={literal(v)}" for n, v, k in src if k]
        ns, _, rest = canonical_op(op_name).partition("::")
        return f"torch.ops.{ns}.{rest}({', '.join(pos + kw)})"

    lines.append(f"expected = {call_src(lambda i: f'e{i}.clone()' if combo[i].startswith('P(') else f't{i}.clone()')}")
    lines += ["with LocalTensorMode(R):", "    mesh = init_device_mesh('cpu', (R,))"]
    for i, spec in enumerate(combo):
        if spec == "R":
            make = f"distribute_tensor(t{i}, mesh, [Replicate()])"
        elif spec.startswith("S("):
            make = f"distribute_tensor(t{i}, mesh, [Shard({spec[2:-1]})])"
        else:
            make = (f"DTensor.from_local(LocalTensor(p{i}), mesh, [Partial({spec[2:-1]!r})], "
                    f"run_check=False, shape=t{i}.shape, stride=t{i}.stride())")
        lines.append(f"    d{i} = {make}")
    lines += [f"    out = {call_src(lambda i: f'd{i}')}",
              "    outs = list(out) if isinstance(out, (list, tuple)) else [out]",
              "    got = [o.full_tensor()._local_tensors[0] if isinstance(o, DTensor) else o for o in outs]",
              "wants = list(expected) if isinstance(expected, (list, tuple)) else [expected]",
              "for k, (g, w) in enumerate(zip(got, wants)):",
              "    print(k, getattr(outs[k], 'placements', '-'), 'expected', tuple(w.shape), 'got', tuple(g.shape),",
              "          'max error', (g.double() - w.double()).abs().max().item() if g.shape == w.shape else '-')"]
    return "\n".join(lines) + "\n"


class Src:
    """A tensor placeholder that `literal` writes as a variable name."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


def load_index(d):
    def bad(why):
        print(f"pytorch_strategies.py: {why}", file=sys.stderr)
        sys.exit(2)
    if not os.path.isdir(d):
        bad(f"{d} is not a directory")
    try:
        with open(os.path.join(d, "index.json")) as f:
            index = json.load(f)
        ranks, n = int(index["ranks"]), int(index["samples"])
        # "files": the sample numbers written (a sample our side skipped has no file).
        ids = [int(i) for i in index["files"]] if "files" in index else list(range(n))
    except (OSError, ValueError, KeyError, TypeError) as e:
        bad(f"{d}/index.json: cannot read ranks and samples ({e})")
    if ranks < 2:
        bad(f"{d}/index.json: ranks is {ranks}, at least 2 needed")
    missing = [f"{i}.pt" for i in ids if not os.path.isfile(os.path.join(d, f"{i}.pt"))]
    if missing:
        bad(f"{d}: {len(missing)} sample file(s) missing: {', '.join(missing[:5])}")
    return ranks, ids


def spread(items, limit):
    """At most `limit` of `items`, evenly spaced (the first included), in order: a cap that still
    visits every input's placements, where the first `limit` would vary only the last input."""
    if limit is None or len(items) <= limit:
        return items
    return [items[i * len(items) // limit] for i in range(limit)]


def run(d, out_path, ops=None, timeout=60.0, limit=None, quiet=False, part=(0, 1)):
    """Runs DIR d into out_path; returns the per-status counts. part (k, n): every n-th sample
    from the k-th only (n processes share the samples, each writing its own file)."""
    ranks, ids = load_index(d)
    ids = ids[part[0]::part[1]]
    header = {"torch": torch.__version__ if torch else None, "ranks": ranks, "world": "LocalTensorMode"}
    try:
        if torch is None:
            raise ImportError("torch is not installed")
        import torch.distributed as dist
        if not dist.is_available():
            raise ImportError("torch.distributed is not available")
        from torch.distributed._local_tensor import LocalTensorMode  # noqa: F401
        from torch.distributed.tensor.debug import CommDebugMode  # noqa: F401
    except (ImportError, AttributeError) as e:
        with open(out_path, "w") as f:
            f.write(json.dumps({**header, "unavailable": str(e)}) + "\n")
        print(f"pytorch_strategies.py: unavailable: {e}")
        return {}
    warnings.filterwarnings("ignore")
    wanted = {canonical_op(o.strip()) for o in ops.split(",") if o.strip()} if ops else None
    world = World(ranks)
    alarm = Alarm()
    counts, started, cpu, done, ran = {}, time.time(), time.process_time(), 0, 0
    with open(out_path, "w") as f:
        f.write(json.dumps(header) + "\n")
        for i in ids:
            sample = torch.load(os.path.join(d, f"{i}.pt"), weights_only=False)
            op_name = sample["op"]
            if wanted is not None and canonical_op(op_name) not in wanted:
                continue
            combos = spread([list(c) for c in sample["combinations"]], limit)
            base = {"sample": i, "op": op_name, "variant": sample.get("variant", "")}
            failure = None
            alarm.start(timeout)
            try:
                with alarm.guarded():
                    op = resolve_op(op_name)
                    world.begin_sample(op)
                    args = convert_args(op, sample["args"])
                    torch.manual_seed(0)
                    expected = call(op, clone_args(args))
            except SampleTimeout:
                failure = {"status": "error", "message": f"single-device op: timed out after {timeout} s"}
            except Exception as e:
                failure = {"status": "error", "message": "single-device op: " + first_line(e)}
            recs = []
            for combo in combos:
                if failure or alarm.expired:
                    rec = failure or {"status": "skipped", "message": f"sample timed out ({timeout} s)"}
                else:
                    ran += 1
                    try:
                        with alarm.guarded():
                            torch.manual_seed(0)
                            rec = run_combination(world, op, args, expected, combo,
                                                  sample.get("rtol"), sample.get("atol"))
                            shift = rec.pop("_shift", 0)
                            if rec["status"] == "wrong":
                                rec["reproducer"] = reproducer(ranks, op_name, args, combo, shift)
                    except SampleTimeout:
                        rec = {"status": "error", "message": f"timed out after {timeout} s"}
                    except Exception as e:
                        rec = {"status": "error", "message": first_line(e)}
                if isinstance(rec.get("max_error"), float) and not abs(rec["max_error"]) < float("inf"):
                    rec["max_error"] = str(rec["max_error"])  # JSON has no NaN or Infinity
                recs.append({k: v for k, v in {**base, "inputs": combo, **rec}.items()
                             if k == "inputs" or v not in (None, "", [])})
            alarm.stop()
            # Replicated inputs that come out "wrong" mean the op's values cannot be compared
            # (shifts by more than the bit width, which are undefined, a kernel that is not
            # deterministic): no combination of the sample says anything about PyTorch's rules.
            if any(r["status"] == "wrong" and all(p == "R" for p in r["inputs"]) for r in recs):
                for r in recs:
                    if r["status"] == "wrong":
                        r.update(status="error", message="values not comparable: the op on replicated inputs "
                                 "differs from the plain call")
                        r.pop("reproducer", None)
            for rec in recs:
                f.write(json.dumps(rec) + "\n")
                counts[rec["status"]] = counts.get(rec["status"], 0) + 1
                done += 1
    seconds, cpu = time.time() - started, time.process_time() - cpu
    if not quiet:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        rate = f"{1000 * seconds / ran:.1f} ms per combination run" if ran else "none run"
        print(f"pytorch_strategies: {done} combinations ({parts}); {ran} run in {seconds:.1f} s"
              f" ({cpu:.1f} s CPU), {rate}")
    return counts


def self_test():
    """Builds a small sample directory and checks a few facts PyTorch's DTensor is known for."""
    torch.manual_seed(1)
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    samples = [
        ("aten::mm", [("self", a, False), ("mat2", b, False)], [["S(0)", "R"], ["R", "S(1)"], ["S(1)", "S(0)"]]),
        ("aten::add.Tensor", [("self", x, False), ("other", y, False), ("alpha", 1, True)],
         [["R", "R"], ["P(sum)", "P(sum)"], ["S(0)", "S(1)"]]),
        ("aten::relu", [("self", x, False)], [["P(sum)"], ["S(1)"]]),
        ("aten::sum.dim_IntList", [("self", x, False), ("dim", [1], False), ("keepdim", False, False),
                                   ("dtype", 7, True)], [["S(0)"], ["P(sum)"], ["P(max)"]]),
        ("aten::cat", [("tensors", [x, y], False), ("dim", 0, False)], [["S(1)", "S(1)"], ["R", "S(0)"]]),
        ("aten::index.Tensor", [("self", x, False), ("indices", [None, torch.tensor([3, 0])], False)],
         [["S(0)", "R"], ["P(sum)", "R"]]),
        ("aten::view", [("self", x, False), ("size", [16], False)], [["S(0)"], ["P(avg)"]]),
        ("aten::neg", [("self", torch.arange(6), False)], [["P(sum)"], ["R"]]),
        ("aten::native_dropout", [("input", torch.randn(64), False), ("p", 0.5, False), ("train", True, False)],
         [["R"], ["S(0)"]]),
        ("aten::convolution", [("input", torch.randn(1, 3, 4), False), ("weight", torch.randn(3, 3, 3), False),
                               ("bias", torch.randn(3), False), ("stride", [2], False), ("padding", [2], False),
                               ("dilation", [1], False), ("transposed", False, False),
                               ("output_padding", [0], False), ("groups", 1, False)], [["R", "R", "P(sum)"]]),
    ]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        for i, (op, args, combos) in enumerate(samples):
            torch.save({"op": op, "variant": "self-test", "args": args, "combinations": combos,
                        "rtol": None, "atol": None}, os.path.join(d, f"{i}.pt"))
        with open(os.path.join(d, "index.json"), "w") as f:
            json.dump({"ranks": 2, "samples": len(samples)}, f)
        out = os.path.join(d, "out.jsonl")
        run(d, out)
        with open(out) as f:
            lines = [json.loads(line) for line in f]
    recs = {(r["op"], tuple(r["inputs"])): r for r in lines[1:]}
    print(json.dumps(lines[0]))
    for r in lines[1:]:
        print(f"  {r['op']:24} {','.join(r['inputs']):14} {r['status']:11} out={','.join(r.get('outputs', []))}"
              f" comms={r.get('redistributions', '-')} {r.get('message', '')[:70]}")

    def check(key, ok, what):
        r = recs.get(key)
        if r is None or not ok(r):
            failures.append(f"{key}: expected {what}, got {r}")

    check(("aten::mm", ("S(0)", "R")), lambda r: r["status"] == "ok" and r["redistributions"] == 0
          and r["outputs"] == ["S(0)"], "ok, S(0), no collective")
    check(("aten::mm", ("S(1)", "S(0)")), lambda r: r["status"] == "ok" and r["outputs"] == ["P(sum)"],
          "ok with P(sum)")
    check(("aten::add.Tensor", ("R", "R")), lambda r: r["status"] == "ok" and r["outputs"] == ["R"], "ok, R")
    check(("aten::relu", ("P(sum)",)), lambda r: r["status"] in ("unsupported", "wrong")
          or r["redistributions"] > 0, "not P(sum) passed through silently")
    check(("aten::sum.dim_IntList", ("P(sum)",)), lambda r: r["status"] == "ok", "ok")
    check(("aten::cat", ("S(1)", "S(1)")), lambda r: r["status"] == "ok", "ok")
    check(("aten::neg", ("P(sum)",)), lambda r: r["status"] == "skipped", "skipped (P of an integer)")
    # Dropout on a shard draws other random numbers than on one device; PyTorch 2.15's
    # convolution rule takes the output's placement from the input alone, here R from a bias
    # P(sum). Both come out "wrong", and their reproducers must run on their own.
    check(("aten::native_dropout", ("S(0)",)), lambda r: r["status"] == "wrong", "wrong")
    check(("aten::convolution", ("R", "R", "P(sum)")), lambda r: r["status"] != "ok" or r["redistributions"] > 0,
          "not R out of a P(sum) bias without a collective")
    repro = "\n".join(r["reproducer"] for r in lines[1:] if "reproducer" in r)
    run_it = subprocess.run([sys.executable, "-c", repro], capture_output=True, text=True)
    if run_it.returncode != 0 or "max error" not in run_it.stdout:
        failures.append(f"the reproducers fail: {run_it.stderr.strip().splitlines()[-1:]}")
    else:
        print("  the reproducers print:", " | ".join(run_it.stdout.strip().splitlines()))
    for f in failures:
        print("FAIL", f)
    print("self-test:", "failed" if failures else "passed")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", help="directory written by strategy_discovery --dump-samples")
    p.add_argument("--out", help="JSON lines file to write")
    p.add_argument("--ops", help="comma-separated ops to run (default: all)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per sample (default 60)")
    p.add_argument("--limit-combinations", type=int, help="run at most N combinations per sample")
    p.add_argument("--part", default="0/1",
                   help="K/N: every N-th sample from the K-th (N processes, one per core, each with its own --out)")
    p.add_argument("--self-test", action="store_true", help="check a few known facts and exit")
    a = p.parse_args()
    try:
        k, n = (int(x) for x in a.part.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        p.error(f"--part {a.part}: K/N with 0 <= K < N expected")
    if a.self_test:
        if torch is None:
            print("self-test: torch is not installed", file=sys.stderr)
            return 1
        return self_test()
    if not a.dir or not a.out:
        p.error("DIR and --out are required")
    run(a.dir, a.out, a.ops, a.timeout, a.limit_combinations, part=(k, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
