"""The GPU re-check (bench/bench_kernel_gpu.py) grows only the input sizes of the task the offline job verified: the
constants only the model's construction reads (kernel size, num_groups, out_channels) keep the job's values, which
the verifier's held-out sizes leave alone too. On an H100 the re-check at KernelBench's cap 64 ran AvgPool2d with
kernel_size 11 against a kernel verified for 5, and GroupNorm with 256 groups against one verified for 8, and
reported them FAILED: a different task's failure, not a false pass of the job's."""

from __future__ import annotations

from bench.bench_kernel_gpu import gpu_sized, original_task, settings
from bench.kernelbench_shrink import shrink
from activities.kernels.task_source import numeric_constants


def job_task(name: str) -> str:
    """The task the offline KernelBench run verifies: the public file shrunk with the bench's default cap."""
    path = original_task(name)
    assert path is not None, name
    return shrink(path.read_text())[0]


def test_settings_are_the_constants_get_inputs_does_not_read():
    task = job_task("level2_85_Conv2d_GroupNorm_Scale_MaxPool_Clamp")
    kept = settings(task)
    assert {"out_channels", "kernel_size", "num_groups", "maxpool_kernel_size"} <= set(kept)
    assert not {"batch_size", "in_channels", "height", "width"} & set(kept)


def test_gpu_sizes_grow_inputs_and_keep_the_jobs_settings():
    for name, grown in (("level1_45_Average_Pooling_2D", "height"),
                        ("level2_85_Conv2d_GroupNorm_Scale_MaxPool_Clamp", "height"),
                        ("level2_94_Gemm_BiasAdd_Hardtanh_Mish_GroupNorm", "in_features")):
        task = job_task(name)
        path = original_task(name)
        assert path is not None
        text, _cap = gpu_sized(path.read_text(), 32.0, keep=settings(task))
        job, gpu = numeric_constants(task), numeric_constants(text)
        assert gpu[grown] > job[grown], name
        for k, v in settings(task).items():
            assert gpu[k] == v, (name, k, gpu[k], v)


def test_without_keep_the_shrink_changes_settings():
    """What the H100 run did (the reason for `keep`): KernelBench's kernel_size 11 comes back at cap 64."""
    path = original_task("level1_45_Average_Pooling_2D")
    assert path is not None
    text, cap = gpu_sized(path.read_text(), 32.0)
    assert (cap, numeric_constants(text)["kernel_size"]) == (64, 11)
    assert settings(job_task("level1_45_Average_Pooling_2D"))["kernel_size"] == 5
