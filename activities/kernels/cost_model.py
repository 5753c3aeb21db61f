"""A roofline cost model that needs no GPU: the candidate's modeled time from what the interpreter counted
(activities/kernels/traffic.py), the eager reference's from its traced aten graph, and the task's speed of
light (SOL), all on one named GPU's peaks (activities/kernels/gpus.py). Pure: no torch, no I/O.

* A launch takes max(bytes / DRAM bandwidth, FLOPs / peak) divided by the share of the GPU its grid can use
  (min(1, programs / SMs): one program runs on one SM), plus the launch overhead. Its bytes are the distinct
  bytes it read and wrote (re-reads within one launch are taken as cache hits; every launch reads its inputs
  from DRAM again). fp32 arithmetic and IEEE `tl.dot` count at the fp32 peak, TF32 dots at the TF32 tensor
  peak, fp16/bf16 dots at the half-precision tensor peak.
* The eager reference: every aten op of the traced forward that is not a view is one launch with its own
  inputs and outputs (views read what they view, once), matmuls and convolutions at the fp32 peak (the TF32
  peak when the precision policy allows TF32: what cuBLAS/cuDNN then use), the rest at the fp32 peak; its
  work is spread as a tuned library kernel would (512 elements or a 128x128 output tile per program).
* SOL: the task's floor (its inputs, parameters and outputs each moved once; its compute ops' FLOPs) on the
  roofline at full occupancy, plus one launch: a kernel call cannot cost less.

From these: modeled speedup = eager / candidate, SOL fraction = SOL / candidate, traffic ratio = candidate
bytes / floor bytes, and SOL-ExecBench's score S = 1 / (1 + (T_k - T_SOL) / (T_b - T_SOL)) with T_b the
modeled eager time. All are models of a GPU, labelled so wherever they are shown; they say where a candidate
moves or launches more than it must, not what a GPU will measure (caches across launches, latency, clocks and
the CPU's launch rate are left out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from activities.kernels.compiler.graph import packet
from activities.kernels.gpus import GPUS, GpuSpec
from activities.kernels.reference import output_bytes, spec_bytes
from activities.kernels.torch_work import VIEWS
from contracts.kernel import PrecisionPolicy
from contracts.kernel_job import AtenCall, LaunchCost, ModeledSpeed, ReferenceAnalysis, TensorSpec

FREE = VIEWS | {"getitem", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
                "lift_fresh_copy", "sym_size", "sym_stride", "sym_numel", "_assert_async", "_assert_scalar"}
"""Aten ops that launch nothing (views, tuple items, bare allocations)."""
GEMM = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "dot", "matmul", "convolution",
                  "_convolution"})
PER_ELEMENT = {"_softmax": 5, "_log_softmax": 5, "_safe_softmax": 5, "softmax": 5, "log_softmax": 5,
               "native_layer_norm": 8, "native_group_norm": 8, "native_batch_norm": 8, "_native_batch_norm_legit": 8,
               "_native_batch_norm_legit_no_training": 8, "logsumexp": 4, "var": 3, "std": 3, "var_mean": 3,
               "mse_loss": 3, "l1_loss": 3, "smooth_l1_loss": 4, "huber_loss": 4, "kl_div": 4}
"""FLOPs per input element of composite ops (everything else not a GEMM: one per element of its largest
tensor). FLOPs of non-GEMM ops rarely matter next to their bytes; they are counted for the floor's honesty."""
ELEMENTS_PER_PROGRAM = 512
"""PyTorch's elementwise CUDA kernels: 128 threads x 4 elements per block (c10's thread_constants.h,
block_work_size())."""
TILE = 128
"""A tuned GEMM's output tile."""
MAX_BREAKDOWN = 40


@dataclass(frozen=True)
class Work:
    """One launch's worth of work, as the roofline sees it."""

    name: str
    bytes: int
    fp32_flops: int = 0
    tf32_flops: int = 0
    half_flops: int = 0
    programs: int = 1

    def seconds(self, gpu: GpuSpec, *, launches: int = 1, occupancy: bool = True) -> float:
        compute = (self.fp32_flops / gpu.fp32_flops + self.tf32_flops / gpu.tf32_flops
                   + self.half_flops / gpu.half_flops)
        share = min(1.0, max(1, self.programs) / gpu.sms) if occupancy else 1.0
        return max(self.bytes / gpu.dram_bytes_s, compute) / share + launches * gpu.launch_s


@dataclass(frozen=True)
class Modeled:
    """The figures and the per-launch / per-op breakdown behind them (stored as an artifact)."""

    speed: ModeledSpeed
    breakdown: dict[str, Any]


def model(analysis: ReferenceAnalysis, launches: list[LaunchCost], gpu_name: str,
          policy: PrecisionPolicy = PrecisionPolicy.STRICT) -> Modeled | str:
    """The candidate's modeled speed, or why there is none (no trace of the reference, nothing launched)."""
    if analysis.trace_error or not analysis.calls and not analysis.outputs:
        return f"no modeled speed: the reference has no traced graph ({analysis.trace_error or 'empty'})"
    if not launches:
        return "no modeled speed: the interpreter counted no launch"
    gpu = GPUS[gpu_name]
    floor = floor_work(analysis, policy)
    sol_s = floor.seconds(gpu, occupancy=False)
    eager = eager_work(analysis, policy)
    eager_s = sum(w.seconds(gpu) for w in eager)
    cand = [launch_work(c) for c in launches]
    times = [w.seconds(gpu) for w in cand]
    cand_s = sum(times)
    cand_bytes = sum(w.bytes for w in cand)
    worst = max(range(len(cand)), key=lambda i: times[i])
    w = cand[worst]
    worst_line = (f"launch {worst + 1}/{len(cand)} {w.name}: {times[worst] * 1e3:.4f} ms, {_mb(w.bytes)} moved, "
                  f"{w.programs} program(s)")
    compute_s = Work("floor", 0, floor.fp32_flops, floor.tf32_flops).seconds(gpu, launches=0, occupancy=False)
    speed = ModeledSpeed(
        gpu=gpu_name, precision=policy.value, sol_ms=sol_s * 1e3, modeled_ms=cand_s * 1e3, eager_ms=eager_s * 1e3,
        speedup=eager_s / cand_s, sol_fraction=min(1.0, sol_s / cand_s), score=sol_score(cand_s, eager_s, sol_s),
        traffic_ratio=cand_bytes / floor.bytes if floor.bytes else 0.0, launches=len(cand), eager_launches=len(eager),
        bytes=cand_bytes, floor_bytes=floor.bytes, floor_flops=floor.fp32_flops + floor.tf32_flops,
        memory_bound=floor.bytes / gpu.dram_bytes_s >= compute_s, worst=worst_line)
    breakdown = {
        "gpu": gpu.name, "precision": policy.value, "label": "modeled, not measured",
        "floor": {"bytes": floor.bytes, "flops": floor.fp32_flops + floor.tf32_flops, "sol_ms": sol_s * 1e3},
        "candidate": [{**c.model_dump(), "ms": t * 1e3} for c, t in zip(launches[:MAX_BREAKDOWN], times)],
        "eager": [{"op": e.name, "bytes": e.bytes, "flops": e.fp32_flops + e.tf32_flops, "ms": e.seconds(gpu) * 1e3}
                  for e in eager[:MAX_BREAKDOWN]],
    }
    return Modeled(speed=speed, breakdown=breakdown)


def feedback(speed: ModeledSpeed, breakdown: dict[str, Any] | None, limit: int = 12) -> list[str]:
    """The optimizer's feedback, one line each: the figures, then every launch against the floor (which kernel
    moves how many bytes, how many launches eager needs): what an LLM optimizer acts on."""
    lines = [speed.summary,
             f"floor: {_mb(speed.floor_bytes)} (inputs, parameters and outputs once), eager: {speed.eager_launches} "
             f"aten op(s); the candidate moves {_mb(speed.bytes)} = {speed.traffic_ratio:.2f}x the floor in "
             f"{speed.launches} launch(es)"]
    if speed.bytes > speed.floor_bytes:
        lines.append(f"{_mb(speed.bytes - speed.floor_bytes)} more than the floor: each launch re-reads what an "
                     "earlier one wrote or read; fusing launches removes both the bytes and the launch overhead")
    for i, c in enumerate((breakdown or {}).get("candidate", [])[:limit], start=1):
        moved = c.get("unique_loaded", 0) + c.get("unique_stored", 0)
        lines.append(f"launch {i} {c.get('kernel')}: {c.get('ms', 0.0):.4f} ms, reads {_mb(c.get('unique_loaded', 0))}, "
                     f"writes {_mb(c.get('unique_stored', 0))} ({moved / speed.floor_bytes:.2f}x the floor), "
                     f"{c.get('programs', 1)} program(s)" if speed.floor_bytes else f"launch {i} {c.get('kernel')}")
    return lines


def sol_score(t_k: float, t_b: float, t_sol: float) -> float:
    """SOL-ExecBench's S = 1 / (1 + (T_k - T_SOL) / (T_b - T_SOL)) in [0, 1]: 0.5 at the baseline's time, 1 at
    the speed of light. A baseline already at SOL leaves no gap: S is 1 for a kernel there too, else 0."""
    gap = t_b - t_sol
    over = max(0.0, t_k - t_sol)
    if gap <= 0:
        return 1.0 if over <= 0 else 0.0
    return 1.0 / (1.0 + over / gap)


def launch_work(c: LaunchCost) -> Work:
    """A counted launch on the roofline: its distinct bytes; a torch op outside the launches is spread like
    a library kernel."""
    moved = c.unique_loaded + c.unique_stored
    programs = c.programs if not c.kernel.startswith("torch:") else _programs_for(moved // 4)
    return Work(c.kernel, moved, c.flops + c.dot_flops, c.tf32_flops, c.half_flops, programs)


def floor_work(a: ReferenceAnalysis, policy: PrecisionPolicy) -> Work:
    """The task's floor: inputs, parameters and outputs once; the FLOPs of its compute ops."""
    gemm = other = 0
    for c in a.calls:
        op = packet(c.op)
        if op in FREE or op.startswith("get_attr"):
            continue
        f = _flops(a, c, op)
        if op in GEMM:
            gemm += f
        else:
            other += f
    tf32 = policy is PrecisionPolicy.KERNELBENCH
    return Work("floor", a.input_bytes + a.param_bytes + output_bytes(a), other + (0 if tf32 else gemm),
                gemm if tf32 else 0)


def eager_work(a: ReferenceAnalysis, policy: PrecisionPolicy) -> list[Work]:
    """One launch per aten op that is not a view, with its own inputs and outputs."""
    tf32 = policy is PrecisionPolicy.KERNELBENCH
    out: list[Work] = []
    for c in a.calls:
        op = packet(c.op)
        if op in FREE or op.startswith("get_attr"):
            continue
        refs = _tensor_refs(c.args) + _tensor_refs(list(c.kwargs.values()))
        unique = {(r.get("ref"), r.get("index")): r for r in refs}
        read = sum(_footprint(a, r) for r in unique.values())
        written = sum(_nbytes(s) for s in c.out)
        f = _flops(a, c, op)
        gemm = op in GEMM
        out.append(Work(op, read + written, 0 if gemm and tf32 else f, f if gemm and tf32 else 0,
                        programs=_gemm_programs(a, c, op) if gemm else _programs_for(_largest(a, c, refs))))
    return out


# --- the traced graph --------------------------------------------------------------------------


def _tensor_refs(values: list) -> list[dict]:
    found = []
    for v in values:
        if isinstance(v, dict) and v.get("ref") in ("input", "param", "node"):
            found.append(v)
        elif isinstance(v, list):
            found += _tensor_refs(v)
    return found


def _spec(a: ReferenceAnalysis, ref: dict) -> TensorSpec | None:
    """The tensor a reference names (a node's first output; a getitem's item)."""
    kind, i = ref.get("ref"), int(ref.get("index", 0))
    if kind == "input":
        return a.inputs[i].tensor if i < len(a.inputs) else None
    if kind == "param":
        return a.params[i].tensor if i < len(a.params) else None
    if kind == "node" and i < len(a.calls):
        return a.calls[i].out[0] if a.calls[i].out else None
    return None


def _footprint(a: ReferenceAnalysis, ref: dict, depth: int = 0) -> int:
    """Bytes an op reads through `ref`: a view reads at most what it views (an expanded bias is its own size)."""
    spec = _spec(a, ref)
    own = _nbytes(spec) if spec is not None else 0
    if ref.get("ref") != "node" or depth > 64:
        return own
    call = a.calls[int(ref["index"])]
    op = packet(call.op)
    if op in VIEWS and call.args and isinstance(call.args[0], dict) and call.args[0].get("ref"):
        return min(own, _footprint(a, call.args[0], depth + 1))
    return own


def _numel(spec: TensorSpec | None) -> int:
    return math.prod(spec.shape) if spec is not None else 0


def _nbytes(spec: TensorSpec | None) -> int:
    return spec_bytes(spec) if spec is not None else 0


def _shape(a: ReferenceAnalysis, value: Any) -> list[int]:
    spec = _spec(a, value) if isinstance(value, dict) else None
    return list(spec.shape) if spec is not None else []


def _flops(a: ReferenceAnalysis, c: AtenCall, op: str) -> int:
    out = _numel(c.out[0]) if c.out else 0
    args = c.args
    if op in ("mm", "bmm", "mv", "dot", "matmul") and args:
        k = (_shape(a, args[0]) or [1])[-1]
        return 2 * max(out, 1) * k
    if op in ("addmm", "baddbmm", "addbmm") and len(args) > 1:
        return 2 * out * (_shape(a, args[1]) or [1])[-1]
    if op in ("convolution", "_convolution") and len(args) > 1:
        w = _shape(a, args[1])
        per = math.prod(w[1:]) if len(w) > 1 else 1
        transposed = bool(args[6]) if len(args) > 6 else False
        base = _numel(_spec(a, args[0])) if transposed and isinstance(args[0], dict) else out
        return 2 * base * per
    refs = _tensor_refs(args)
    largest = max([out] + [_numel(_spec(a, r)) for r in refs])
    if op.startswith(("max_pool", "avg_pool")) and len(args) > 1:
        window = math.prod(args[1]) if isinstance(args[1], list) else int(args[1] or 1)
        return out * window
    return PER_ELEMENT.get(op, 1) * largest


def _largest(a: ReferenceAnalysis, c: AtenCall, refs: list[dict]) -> int:
    return max([_numel(s) for s in c.out] + [_numel(_spec(a, r)) for r in refs] + [1])


def _programs_for(elements: int) -> int:
    return max(1, -(-elements // ELEMENTS_PER_PROGRAM))


def _gemm_programs(a: ReferenceAnalysis, c: AtenCall, op: str) -> int:
    """128x128 output tiles: a tuned GEMM's grid (a convolution's rows are batch x output positions)."""
    out = c.out[0].shape if c.out else [1]
    if op in ("convolution", "_convolution") and len(out) >= 2:
        rows = out[0] * math.prod(out[2:])
        return max(1, -(-rows // TILE) * -(-out[1] // TILE))
    if len(out) >= 2:
        batch = math.prod(out[:-2])
        return max(1, batch * -(-out[-2] // TILE) * -(-out[-1] // TILE))
    return max(1, -(-(out[0] if out else 1) // TILE))


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
