"""The roofline cost model (activities/kernels/cost_model.py) on hand-made traces and counts, against
hand-computed times: pure, no torch."""

from __future__ import annotations

import pytest

from activities.kernels.cost_model import eager_work, floor_work, model, sol_score
from activities.kernels.gpus import GPUS, roofline_gpu
from contracts.kernel import GPU_ARCHES, PrecisionPolicy, RooflineGpu
from contracts.kernel_job import AtenCall, InputSpec, LaunchCost, ParamSpec, ReferenceAnalysis, TensorSpec

H100 = GPUS["h100"]
F32 = "float32"


def t(*shape: int) -> TensorSpec:
    return TensorSpec(shape=list(shape), dtype=F32)


def softmax_task(rows: int = 256, cols: int = 4096) -> ReferenceAnalysis:
    """forward(x) = softmax(x, dim=1), as the probe traces it."""
    x = t(rows, cols)
    return ReferenceAnalysis(inputs=[InputSpec(kind="tensor", tensor=x)], input_bytes=rows * cols * 4,
                             calls=[AtenCall(op="aten._softmax.default", args=[{"ref": "input", "index": 0}, 1, False],
                                             out=[x])],
                             outputs=[{"ref": "node", "index": 0}])


def linear_relu_task(m: int = 512, k: int = 1024, n: int = 2048) -> ReferenceAnalysis:
    """forward(x) = relu(x @ W.T + b): t (a view), addmm, relu."""
    return ReferenceAnalysis(
        inputs=[InputSpec(kind="tensor", tensor=t(m, k))],
        params=[ParamSpec(name="fc.weight", tensor=t(n, k)), ParamSpec(name="fc.bias", tensor=t(n))],
        input_bytes=m * k * 4, param_bytes=(n * k + n) * 4,
        calls=[AtenCall(op="aten.t.default", args=[{"ref": "param", "index": 0}], out=[t(k, n)]),
               AtenCall(op="aten.addmm.default", args=[{"ref": "param", "index": 1}, {"ref": "input", "index": 0},
                                                       {"ref": "node", "index": 0}], out=[t(m, n)]),
               AtenCall(op="aten.relu.default", args=[{"ref": "node", "index": 1}], out=[t(m, n)])],
        outputs=[{"ref": "node", "index": 2}])


def test_the_floor_moves_inputs_parameters_and_outputs_once_and_counts_the_gemm_flops():
    a = linear_relu_task()
    floor = floor_work(a, PrecisionPolicy.STRICT)
    assert floor.bytes == (512 * 1024 + 2048 * 1024 + 2048 + 512 * 2048) * 4
    assert floor.fp32_flops == 2 * 512 * 2048 * 1024 + 512 * 2048 and floor.tf32_flops == 0
    tf32 = floor_work(a, PrecisionPolicy.KERNELBENCH)
    assert tf32.tf32_flops == 2 * 512 * 2048 * 1024 and tf32.fp32_flops == 512 * 2048


def test_eager_is_one_launch_per_op_that_is_not_a_view_with_its_own_inputs_and_outputs():
    ops = eager_work(linear_relu_task(), PrecisionPolicy.STRICT)
    assert [w.name for w in ops] == ["addmm", "relu"]
    addmm, relu = ops
    assert addmm.bytes == (2048 + 512 * 1024 + 2048 * 1024 + 512 * 2048) * 4  # the transposed weight read once
    assert addmm.programs == 4 * 16  # 128x128 output tiles
    assert relu.bytes == 2 * 512 * 2048 * 4 and relu.programs == 512 * 2048 // 512  # PyTorch's 512-element blocks


def test_one_fused_softmax_launch_at_the_floor_is_at_the_speed_of_light():
    a = softmax_task()
    n = 256 * 4096 * 4
    fused = LaunchCost(kernel="softmax", programs=256, loaded=2 * n, stored=n, unique_loaded=n, unique_stored=n,
                       flops=5 * 256 * 4096)
    m = model(a, [fused], "h100")
    assert not isinstance(m, str)
    s = m.speed
    sol = 2 * n / H100.dram_bytes_s + H100.launch_s
    assert s.sol_ms == pytest.approx(sol * 1e3)
    assert s.modeled_ms == pytest.approx(sol * 1e3)  # 256 programs fill the 132 SMs; re-reads are cache hits
    assert s.eager_ms == pytest.approx(sol * 1e3)  # _softmax is one aten op with the same bytes
    assert s.speedup == pytest.approx(1.0) and s.sol_fraction == pytest.approx(1.0) and s.score == pytest.approx(1.0)
    assert s.traffic_ratio == pytest.approx(1.0) and s.launches == 1 and s.eager_launches == 1 and s.memory_bound


def test_a_three_launch_softmax_moves_three_times_the_floor_and_models_slower_than_eager():
    a = softmax_task()
    n = 256 * 4096 * 4
    row = 256 * 4
    launches = [LaunchCost(kernel="amax", programs=256, unique_loaded=n, unique_stored=row),
                LaunchCost(kernel="sum_exp", programs=256, unique_loaded=n + row, unique_stored=row),
                LaunchCost(kernel="div", programs=1024, unique_loaded=n + 2 * row, unique_stored=n)]
    m = model(a, launches, "h100")
    assert not isinstance(m, str)
    s = m.speed
    moved = 4 * n + 5 * row
    expected = moved / H100.dram_bytes_s + 3 * H100.launch_s
    assert s.modeled_ms == pytest.approx(expected * 1e3)
    assert s.traffic_ratio == pytest.approx(moved / (2 * n))
    assert s.speedup == pytest.approx((2 * n / H100.dram_bytes_s + H100.launch_s) / expected)
    assert s.speedup < 1 and s.score < 0.5
    assert s.worst.startswith("launch 3/3 div")
    assert [c["kernel"] for c in m.breakdown["candidate"]] == ["amax", "sum_exp", "div"]
    assert m.breakdown["label"] == "modeled, not measured"


def test_a_grid_smaller_than_the_gpu_uses_only_its_share_of_the_sms():
    a = softmax_task()
    n = 256 * 4096 * 4
    one = LaunchCost(kernel="one_program", programs=1, unique_loaded=n, unique_stored=n)
    m = model(a, [one], "h100")
    assert not isinstance(m, str)
    assert m.speed.modeled_ms == pytest.approx((2 * n / H100.dram_bytes_s * H100.sms + H100.launch_s) * 1e3)


def test_ieee_and_tf32_dots_count_at_their_own_peaks_and_tf32_baselines_follow_the_policy():
    a = linear_relu_task()
    flops = 2 * 512 * 2048 * 1024
    ieee = LaunchCost(kernel="mm", programs=4096, unique_loaded=10, unique_stored=10, dot_flops=flops)
    tf32 = ieee.model_copy(update={"dot_flops": 0, "tf32_flops": flops})
    strict = model(a, [ieee], "h100", PrecisionPolicy.STRICT)
    fast = model(a, [tf32], "h100", PrecisionPolicy.KERNELBENCH)
    assert not isinstance(strict, str) and not isinstance(fast, str)
    assert strict.speed.modeled_ms == pytest.approx((flops / H100.fp32_flops + H100.launch_s) * 1e3)
    assert fast.speed.modeled_ms == pytest.approx((flops / H100.tf32_flops + H100.launch_s) * 1e3)
    assert not strict.speed.memory_bound
    # the eager baseline's addmm switches peaks with the policy, so a TF32 kernel is never compared with fp32 eager
    assert fast.speed.eager_ms < strict.speed.eager_ms
    assert fast.speed.precision == "kernelbench"


def test_sol_score_is_half_at_the_baseline_one_at_the_speed_of_light_and_bounded():
    assert sol_score(2.0, 2.0, 1.0) == pytest.approx(0.5)
    assert sol_score(1.0, 2.0, 1.0) == pytest.approx(1.0)
    assert sol_score(3.0, 2.0, 1.0) == pytest.approx(1 / 3)
    assert sol_score(0.5, 2.0, 1.0) == pytest.approx(1.0)  # below the floor counts as at it
    assert sol_score(1.0, 1.0, 1.0) == 1.0 and sol_score(1.5, 1.0, 1.0) == 0.0  # the baseline is already at SOL


def test_no_model_without_a_traced_reference_or_without_counts():
    assert "no traced graph" in model(ReferenceAnalysis(trace_error="boom"), [LaunchCost(kernel="k")], "h100")
    assert "counted no launch" in model(softmax_task(), [], "h100")


def test_the_gpu_table_covers_the_contract_and_a_gpu_arch_models_itself():
    assert set(GPUS) == set(RooflineGpu.__args__) and set(GPUS) <= GPU_ARCHES
    assert roofline_gpu("a100") == "a100" and roofline_gpu("cpu-interpreter") == "h100"
    assert roofline_gpu("cpu-interpreter", "b200") == "b200" and roofline_gpu("t4", "l40s") == "l40s"
    for spec in GPUS.values():
        assert spec.tf32_flops > spec.fp32_flops and spec.dram_bytes_s > 5e11 and spec.sms > 100
