"""The building blocks, one module each: the kernel source it generates (sizes as arguments, block sizes as
parameters), the Python launcher the forward calls (sizes, allocation, views, the launch's arguments), and the
emitter registered for its graph nodes (`registry.emits`). Importing this package registers them all.

* pointwise: a fused chain of elementwise ops over broadcast inputs (also flip, triu/tril, cat's copies);
* reduction: sum / mean / amax / amin / argmax / argmin / logsumexp over any dims, its input chain fused in;
* matmul: (batched) A @ B on strided operands, tl.dot with an fp32 accumulator;
* conv: 1-3D convolution as an implicit GEMM (stride, padding, dilation, groups, transposed; a strided transposed
  one by output phase, so no program computes the kernel offsets that cannot reach its outputs);
* pool: 1-3D max / average pooling;
* scan: cumsum / cumprod along one dim, tile by tile with a carry;
* gather: x[i, idx[i]];
* recurrent: LSTM / GRU / RNN layers, a loop over the time steps of matmuls and a fused cell kernel;
* random: torch.randn where the reference draws (no kernel: the same numbers from the same generator);
* views: no kernel, torch views whose sizes come from the run-time tensors.
"""

from activities.kernels.compiler.blocks import (  # noqa: F401 - imported to register
    conv,
    gather,
    matmul,
    pointwise,
    pool,
    random,
    recurrent,
    reduction,
    scan,
    views,
)
