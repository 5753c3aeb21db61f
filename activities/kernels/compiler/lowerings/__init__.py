"""The lowerings, one module per kind of op; importing this package registers them all (`registry.lowers`).

Each module's ops have their cases in tests/unit/compiler/test_lowerings_<module>.py.
"""

from activities.kernels.compiler.lowerings import (  # noqa: F401 - imported to register
    conv,
    linear,
    losses,
    norms,
    pointwise,
    pool,
    recurrent,
    reductions,
    scan,
    tensors,
    views,
)
