"""The GPUs the cost model knows: peak DRAM bandwidth, fp32 and TF32 (and fp16) FLOP/s, SM count and the
launch overhead, each from the vendor's datasheet (dense figures: NVIDIA quotes tensor-core peaks "with
sparsity", twice the dense ones; the dense ones are used here).

Sources:
* H100 SXM5 80GB: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): HBM3 3.35 TB/s,
  FP32 67 TFLOPS (66.9), TF32 Tensor Core 989 TFLOPS with sparsity (494.7 dense), FP16/BF16 1,979 with
  sparsity (989.4 dense); 132 SMs (NVIDIA Hopper architecture whitepaper).
* A100 SXM4 80GB: NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf):
  HBM2e 2,039 GB/s, FP32 19.5 TFLOPS, TF32 156 TFLOPS dense (312 with sparsity), FP16 312 dense; 108 SMs
  (NVIDIA Ampere architecture whitepaper).
* L40S: NVIDIA L40S datasheet: GDDR6 864 GB/s, FP32 91.6 TFLOPS, TF32 Tensor Core 183 TFLOPS dense (366 with
  sparsity), FP16 362 dense; 142 SMs.
* B200 (HGX B200, 1,000 W): NVIDIA HGX platform specifications per 8 GPUs: HBM3e 64 TB/s (8 TB/s each),
  FP32 600 TFLOPS (75 each), TF32 Tensor Core 18 PFLOPS with sparsity (1.1 PFLOPS dense each), FP16/BF16
  36 PFLOPS with sparsity (2.25 dense each); 148 SMs.
* Launch overhead, all: "Getting Started with CUDA Graphs" (NVIDIA technical blog, 2019): back-to-back kernel
  launches on one stream cost a few microseconds each beyond the kernels' own run time (3.8 us per ~2.9 us
  kernel without graphs). 3 us is used for every kernel launch and every eager aten op alike, so the
  comparison with eager is launch for launch.
* Compute capability and shared memory a program may use: CUDA C++ Programming Guide, "Technical Specifications per
  Compute Capability" (maximum shared memory per thread block, opt-in): 8.0 163 KB, 8.9 99 KB, 9.0 and 10.0 227 KB.

Peaks are what a kernel can at best reach; the model's times are lower bounds of that GPU's, never measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.kernel import GPU_ARCHES


@dataclass(frozen=True)
class GpuSpec:
    name: str
    dram_bytes_s: float
    """Peak DRAM (HBM / GDDR) bandwidth, bytes per second."""
    fp32_flops: float
    """Peak fp32 FLOP/s on the CUDA cores (vector FMA counted as 2)."""
    tf32_flops: float
    """Peak dense TF32 tensor-core FLOP/s."""
    half_flops: float
    """Peak dense fp16 / bf16 tensor-core FLOP/s."""
    sms: int
    """Streaming multiprocessors: a grid of fewer programs leaves the rest idle."""
    compute_capability: int
    """CUDA compute capability x 10 (90: sm_90), the target the GPU compile check compiles for."""
    shared_bytes: int
    """Shared memory one program (thread block) may use: a kernel that needs more compiles, then fails at launch."""
    launch_s: float = 3e-6
    """Seconds one kernel launch (or one eager aten op's launch) adds."""

    @property
    def ridge(self) -> float:
        """FLOPs per byte where fp32 compute and DRAM bandwidth take the same time."""
        return self.fp32_flops / self.dram_bytes_s


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100 SXM5 80GB", dram_bytes_s=3.35e12, fp32_flops=66.9e12, tf32_flops=494.7e12,
                    half_flops=989.4e12, sms=132, compute_capability=90, shared_bytes=232_448),
    "a100": GpuSpec("A100 SXM4 80GB", dram_bytes_s=2.039e12, fp32_flops=19.5e12, tf32_flops=156e12,
                    half_flops=312e12, sms=108, compute_capability=80, shared_bytes=166_912),
    "l40s": GpuSpec("L40S", dram_bytes_s=864e9, fp32_flops=91.6e12, tf32_flops=183e12, half_flops=362e12, sms=142,
                    compute_capability=89, shared_bytes=101_376),
    "b200": GpuSpec("B200 (HGX, 1000 W)", dram_bytes_s=8e12, fp32_flops=75e12, tf32_flops=1.1e15,
                    half_flops=2.25e15, sms=148, compute_capability=100, shared_bytes=232_448),
}
DEFAULT_GPU = "h100"


def roofline_gpu(arch: str, requested: str = DEFAULT_GPU) -> str:
    """The GPU a job's speed is modeled for: its own `arch` when the table has it (an `--arch a100` job), else
    the one the task names (`roofline_gpu`, h100 by default) for the CPU interpreter and other GPUs."""
    if arch in GPUS and arch in GPU_ARCHES:
        return arch
    return requested if requested in GPUS else DEFAULT_GPU


def roofline_spec(arch: str, requested: str = DEFAULT_GPU) -> GpuSpec:
    """`roofline_gpu`'s spec: the GPU a CPU job's kernels must also compile for (the verifier, the coder's prompt)."""
    return GPUS[roofline_gpu(arch, requested)]
