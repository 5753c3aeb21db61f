"""Model inputs for calibration and evaluation: the user's data, or synthetic data that is valid.

Real data (`--calibration`): an .npz mapping each graph input's name to an array whose leading
axis holds the samples ([N, *shape]; an array of exactly the input's shape is one sample, one whose
first axis is N × a batch of 1 is N samples), or a folder of such files (concatenated in name
order). `ingest` checks it against the model's inputs and writes one canonical, byte-reproducible
.npz, so the same data has the same sha256 in every run (the step cache keys on it).

Synthetic data (seeded) respects each input's dtype and role, read from the ops that consume it:
* an index (Gather/GatherElements/ScatterElements indices, OneHot indices) gets values in the valid
  range of the axis it indexes, when that dimension is known;
* an input that sets a shape, axes, sizes or counts (Reshape.shape, Slice.starts, ReduceSum.axes,
  TopK.k, ...) cannot be guessed: CALIBRATION_NEEDED names it and asks for real data;
* a float input of an op with a restricted domain (Log, Sqrt, Acos, ...) gets values inside it;
* an input named like a mask (`attention_mask`, ...) is a padding mask: ones with a run of zeros at the end;
* other integers are in [1, 8) (never 0: integer division), booleans are 0/1, floats standard normal.

Calibration and evaluation never see the same sample (the accuracy gate would grade its own homework):
synthetic evaluation inputs use another seed *and* families the calibration never draws from (smooth
images with natural 1/f statistics beside noise; Zipf-distributed token ids, padded where the mask is
zero, instead of uniform ids; masks that always contain zeros); user data is split (`split_held_out`)
and a separate evaluation set is checked against it (`overlap`).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from contracts.errors import Err, FleetforgeError

Purpose = Literal["calibration", "evaluation"]
CALIBRATION_FAMILIES = {"float": ("noise",), "index": ("uniform ids",), "mask": ("padding masks",)}
EVALUATION_FAMILIES = {"float": ("natural images", "noise"), "index": ("zipf token ids",), "mask": ("padding masks",)}
"""Input kind → the synthetic families drawn from (sample i takes family i mod n). Every kind with more
than one family in the world has one in evaluation that calibration never uses."""

Feed = dict[str, Any]
"""Input name → numpy array (one sample)."""

SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}), "ConstantOfShape": frozenset({0}),
    "Slice": frozenset({1, 2, 3, 4}), "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}), "Split": frozenset({1}),
    "TopK": frozenset({1}), "Pad": frozenset({1, 2, 3}), "Resize": frozenset({1, 2, 3}), "Upsample": frozenset({1}),
    "Range": frozenset({0, 1, 2}), "OneHot": frozenset({1}), "CumSum": frozenset({1}), "Trilu": frozenset({1}),
    "NonMaxSuppression": frozenset({2, 3, 4}), "ReverseSequence": frozenset({1}), "GatherND": frozenset({1}),
    "ScatterND": frozenset({1}), "Col2Im": frozenset({1, 2}), "CenterCropPad": frozenset({1}), "MaxUnpool": frozenset({2}),
    "DFT": frozenset({1, 2}), "STFT": frozenset({1, 3}), "RoiAlign": frozenset({2}), "Compress": frozenset(),
    "BlackmanWindow": frozenset({0}), "HannWindow": frozenset({0}), "HammingWindow": frozenset({0}),
    "MelWeightMatrix": frozenset({0, 1, 2, 3, 4}), "Bernoulli": frozenset(), "Multinomial": frozenset(),
    "ReduceSum": frozenset({1}), "ReduceMean": frozenset({1}), "ReduceMax": frozenset({1}), "ReduceMin": frozenset({1}),
    "ReduceProd": frozenset({1}), "ReduceL1": frozenset({1}), "ReduceL2": frozenset({1}), "ReduceLogSum": frozenset({1}),
    "ReduceLogSumExp": frozenset({1}), "ReduceSumSquare": frozenset({1}), "Loop": frozenset({0, 1}),
}
"""op → inputs whose values are shapes, axes, sizes or counts (only real data can be valid)."""

INDEX_INPUTS: dict[str, tuple[int, int, str | int]] = {
    "Gather": (1, 0, "axis"), "GatherElements": (1, 0, "axis"), "ScatterElements": (1, 0, "axis"),
    "Scatter": (1, 0, "axis"), "NegativeLogLikelihoodLoss": (1, 0, 1), "SoftmaxCrossEntropyLoss": (1, 0, 1),
}
"""op → (indices input, data input, axis attribute or fixed axis): indices lie in [0, data.shape[axis])
(a loss's labels are class indices along axis 1 of its scores)."""

POSITIVE = {("Log", 0), ("Sqrt", 0), ("Reciprocal", 0), ("Pow", 0), ("Div", 1), ("BatchNormalization", 4),
            ("Mod", 1), ("Rsqrt", 0), ("InstanceNormalization", 0)}
UNIT = {("Acos", 0), ("Asin", 0), ("Atanh", 0)}
ABOVE_ONE = {("Acosh", 0)}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: list[int]
    """Symbolic or unknown dims as 1."""
    dtype: Any
    """numpy dtype."""
    batch_free: bool = True
    """The first dim is 1 or symbolic (a leading-axis sample split fits)."""


def graph_inputs(model: Path) -> list[InputSpec]:
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = []
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = list(tt.shape.dim)
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
        first_free = not dims or not dims[0].HasField("dim_value") or dims[0].dim_value in (0, 1)
        out.append(InputSpec(vi.name, shape, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type), first_free))
    return out


# ---- synthetic inputs ---------------------------------------------------------------------------


def synthetic_feeds(model: Path, *, samples: int, seed: int, purpose: Purpose = "calibration") -> list[Feed]:
    """Seeded inputs valid for every input's role (see the module doc); CALIBRATION_NEEDED when an
    input's valid values cannot be guessed. `purpose` picks the families (CALIBRATION_FAMILIES or
    EVALUATION_FAMILIES): the same seed gives different samples for each."""
    import numpy as np

    specs = graph_inputs(model)
    roles = _roles(model, {s.name for s in specs})
    rng = np.random.default_rng(seed)
    families = CALIBRATION_FAMILIES if purpose == "calibration" else EVALUATION_FAMILIES
    feeds = []
    for i in range(samples):
        feed = {s.name: _synthetic(s, roles.get(s.name, ("any", None)), rng, _family(families, s, roles, i), purpose)
                for s in specs}
        feeds.append(_pad_tokens(feed, specs, roles))
    return feeds


def families_used(model: Path, purpose: Purpose, samples: int) -> list[str]:
    """The synthetic families `synthetic_feeds` draws from for `model` (for the report)."""
    specs = graph_inputs(model)
    roles = _roles(model, {s.name for s in specs})
    families = CALIBRATION_FAMILIES if purpose == "calibration" else EVALUATION_FAMILIES
    found = {_family(families, s, roles, i) for s in specs for i in range(min(samples, 4))}
    return sorted(f for f in found if f)


def _kind(spec: InputSpec, roles: dict[str, tuple[str, Any]]) -> str:
    import numpy as np

    role = roles.get(spec.name, ("any", None))[0]
    if _is_mask(spec, role):
        return "mask"
    if role == "index":
        return "index"
    if role == "any" and np.dtype(spec.dtype).kind == "f":
        return "float"
    return ""


def _family(families: dict[str, tuple[str, ...]], spec: InputSpec, roles: dict[str, tuple[str, Any]], i: int) -> str:
    options = families.get(_kind(spec, roles), ())
    return options[i % len(options)] if options else ""


def _is_mask(spec: InputSpec, role: str) -> bool:
    """A padding/attention mask: named so, an integer/bool/float input of rank >= 2 in no other role."""
    import numpy as np

    return (role == "any" and "mask" in spec.name.lower() and len(spec.shape) >= 2
            and np.dtype(spec.dtype).kind in "biuf")


def _pad_tokens(feed: Feed, specs: list[InputSpec], roles: dict[str, tuple[str, Any]]) -> Feed:
    """Token ids where the padding mask is zero become 0 (the padding id), as a tokenizer pads."""
    masks = [feed[s.name] for s in specs if _kind(s, roles) == "mask"]
    if not masks:
        return feed
    out = dict(feed)
    for s in specs:
        if _kind(s, roles) == "index":
            for m in masks:
                if m.shape == out[s.name].shape:
                    out[s.name] = (out[s.name] * (m != 0)).astype(out[s.name].dtype)
    return out


def _roles(model: Path, names: set[str]) -> dict[str, tuple[str, Any]]:
    """Input name → (role, detail): ("shape", "Reshape.shape"), ("index", upper bound or None), ("positive", None) ..."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    shapes = {i.name: list(i.dims) for i in m.graph.initializer}
    for vi in list(m.graph.input) + list(m.graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes.setdefault(vi.name, [d.dim_value for d in dims])
    roles: dict[str, tuple[str, Any]] = {}
    rank = {"shape": 4, "index": 3, "unit": 2, "above_one": 2, "positive": 1, "any": 0}

    def claim(name: str, role: tuple[str, Any]) -> None:
        if name in names and rank[role[0]] > rank[roles.get(name, ("any", None))[0]]:
            roles[name] = role

    for node in m.graph.node:
        for i, name in enumerate(node.input):
            if i in SHAPE_INPUTS.get(node.op_type, ()):
                claim(name, ("shape", f"{node.op_type} input {i}"))
            elif (node.op_type, i) in UNIT:
                claim(name, ("unit", None))
            elif (node.op_type, i) in ABOVE_ONE:
                claim(name, ("above_one", None))
            elif (node.op_type, i) in POSITIVE:
                claim(name, ("positive", None))
        spec = INDEX_INPUTS.get(node.op_type)
        if spec and len(node.input) > spec[0]:
            idx, data, attr = spec
            axis = attr if isinstance(attr, int) else next(
                (onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == attr), 0)
            dims = shapes.get(node.input[data])
            bound = dims[axis] if dims and -len(dims) <= axis < len(dims) else None
            claim(node.input[idx], ("index", bound if bound else f"{node.op_type} indices"))
        if node.op_type == "OneHot" and len(node.input) > 1:
            claim(node.input[0], ("index", None if node.input[1] in names else _const_scalar(m, node.input[1])))
    return roles


def _const_scalar(m: Any, name: str) -> int | None:
    from onnx import numpy_helper

    for init in m.graph.initializer:
        if init.name == name:
            value = numpy_helper.to_array(init).ravel()
            return int(value[0]) if value.size else None
    return None


def _synthetic(spec: InputSpec, role: tuple[str, Any], rng: Any, family: str = "", purpose: Purpose = "calibration") -> Any:
    import numpy as np

    kind, detail = role
    dtype = np.dtype(spec.dtype)
    if family == "padding masks":
        return _padding_mask(spec.shape, rng, always=purpose == "evaluation").astype(dtype)
    if family == "zipf token ids" and isinstance(detail, int):
        return ((rng.zipf(1.2, size=spec.shape) - 1) % int(detail)).astype(dtype)
    if family == "natural images":
        return _natural(spec.shape, rng).astype(dtype)
    if kind == "shape" or (kind == "index" and not isinstance(detail, int)):
        what = detail if kind == "shape" else f"the indices of {detail} into a dimension that is not static"
        raise FleetforgeError(Err.CALIBRATION_NEEDED, f"input {spec.name!r} is {what}: its valid values cannot be "
                              f"synthesized; give real inputs with --calibration FILE.npz ({spec.name!r} -> array)")
    if dtype.kind in "OSU":
        raise FleetforgeError(Err.CALIBRATION_NEEDED, f"input {spec.name!r} is a string tensor; give real inputs with "
                              "--calibration FILE.npz")
    if dtype == np.bool_:
        return rng.integers(0, 2, size=spec.shape).astype(np.bool_)
    if kind == "index":
        return rng.integers(0, int(detail), size=spec.shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(1, 8, size=spec.shape).astype(dtype)
    if kind == "unit":
        return rng.uniform(-0.9, 0.9, size=spec.shape).astype(dtype)
    if kind == "above_one":
        return rng.uniform(1.1, 3.0, size=spec.shape).astype(dtype)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, size=spec.shape).astype(dtype)
    return rng.standard_normal(spec.shape).astype(dtype)


def _padding_mask(shape: list[int], rng: Any, *, always: bool) -> Any:
    """Ones with a run of zeros at the end of the last axis (right padding); `always`: at least one zero."""
    import numpy as np

    mask = np.ones(shape, dtype=np.int64)
    length = shape[-1]
    if length < 2:
        return mask
    flat = mask.reshape(-1, length)
    for row in flat:
        pad = int(rng.integers(1 if always else 0, length // 2 + 1))
        if pad:
            row[length - pad:] = 0
    return flat.reshape(shape)


def _natural(shape: list[int], rng: Any) -> Any:
    """A smooth field with natural images' 1/f amplitude spectrum over the last two axes (the last one
    for rank 2), standardised per leading index to mean 0, std 1 (the range of normalised images)."""
    import numpy as np

    if len(shape) < 2 or shape[-1] < 4:
        return rng.standard_normal(shape)
    axes = (-2, -1) if len(shape) >= 3 and shape[-2] >= 4 else (-1,)
    white = rng.standard_normal(shape)
    spectrum = np.fft.fftn(white, axes=axes)
    freqs = [np.fft.fftfreq(shape[a]) for a in axes]
    grid = np.meshgrid(*freqs, indexing="ij")
    radius = np.sqrt(sum(g ** 2 for g in grid))
    radius[(0,) * len(axes)] = 1.0
    field = np.real(np.fft.ifftn(spectrum / radius, axes=axes))
    lead = field.reshape(-1, *[shape[a] for a in axes])
    lead = (lead - lead.mean(axis=tuple(range(1, lead.ndim)), keepdims=True)) / (
        lead.std(axis=tuple(range(1, lead.ndim)), keepdims=True) + 1e-12)
    return lead.reshape(shape)


# ---- sample identity and the held-out split ----------------------------------------------------


def sample_key(feed: Feed) -> str:
    """sha256 of one sample (every input's name, dtype, shape and bytes): equal keys = the same sample."""
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(feed):
        a = np.ascontiguousarray(feed[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def overlap(evaluation: list[Feed], calibration: list[Feed]) -> int:
    """How many evaluation samples are also calibration samples (must be 0)."""
    seen = {sample_key(f) for f in calibration}
    return sum(sample_key(f) in seen for f in evaluation)


def split_held_out(stacked: dict[str, Any], eval_samples: int, seed_text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(calibration part, held-out evaluation part) of the user's samples: up to `eval_samples` distinct
    samples (at most half of them), drawn by a permutation seeded from `seed_text` (the data's sha256,
    so the split is reproducible and not the file's order); a duplicate of a held-out sample is held out
    with it, so no evaluation sample is ever a calibration sample. CALIBRATION_INVALID when fewer than
    two distinct samples leave nothing to hold out."""
    import numpy as np

    feeds = feeds_from(stacked)
    keys = [sample_key(f) for f in feeds]
    distinct = list(dict.fromkeys(keys))
    held = min(eval_samples, len(distinct) // 2)
    if held < 1:
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"the calibration data holds {len(distinct)} distinct sample(s): "
                              "none can be held out to grade the result; give more samples, or a separate evaluation "
                              "set with --eval-data")
    rng = np.random.default_rng(int(seed_text[:16], 16))
    chosen = {distinct[i] for i in rng.permutation(len(distinct))[:held]}
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    eval_idx = sorted(first[k] for k in chosen)
    cal_idx = [i for i, k in enumerate(keys) if k not in chosen]
    return ({k: v[cal_idx] for k, v in stacked.items()}, {k: v[eval_idx] for k, v in stacked.items()})


# ---- real data --------------------------------------------------------------------------------


def read_npz(source: Path) -> dict[str, Any]:
    """An .npz, or a folder of them concatenated along the sample axis in file-name order."""
    import numpy as np

    files = sorted(source.glob("*.npz")) if source.is_dir() else [source]
    if not files:
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"{source} holds no .npz files")
    parts: dict[str, list[Any]] = {}
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as npz:
                for k in npz.files:
                    parts.setdefault(k, []).append(npz[k])
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise FleetforgeError(Err.CALIBRATION_INVALID, f"{f.name} is not a readable .npz: {e}") from None
    if len({len(v) for v in parts.values()}) > 1:
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"the files in {source} do not all hold the same input names")
    return {k: v[0] if len(v) == 1 else np.concatenate([_batched(x) for x in v]) for k, v in parts.items()}


def _batched(x: Any) -> Any:
    return x[None] if x.ndim == 0 else x


def samples_of(arrays: dict[str, Any], specs: list[InputSpec]) -> dict[str, Any]:
    """Each input's samples stacked as [N, *shape], cast to the input's dtype; CALIBRATION_INVALID
    says which input is missing or does not fit."""
    import numpy as np

    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in arrays]
    if missing:
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"the calibration data has no array for input(s) "
                              f"{', '.join(missing)}; it has {', '.join(sorted(arrays)) or 'none'}; the model's inputs: "
                              f"{', '.join(expected)}")
    out: dict[str, Any] = {}
    for s in specs:
        a = np.asarray(arrays[s.name])
        rank = len(s.shape)
        if a.ndim == rank + 1 and _fits(a.shape[1:], s.shape):
            stacked = a
        elif a.ndim == rank and rank and s.batch_free and _fits(a.shape[1:], s.shape[1:]):
            stacked = a.reshape((a.shape[0], 1, *a.shape[1:]))  # N samples of batch 1
        elif a.ndim == rank and _fits(a.shape, s.shape):
            stacked = a[None]
        else:
            raise FleetforgeError(Err.CALIBRATION_INVALID, f"calibration array {s.name!r} has shape {list(a.shape)}; "
                                  f"the input takes {s.shape} (give [N, *shape] for N samples)")
        _check_dtype(s, a)
        out[s.name] = stacked.astype(s.dtype)
    counts = {len(v) for v in out.values()}
    if len(counts) > 1 or 0 in counts:
        raise FleetforgeError(Err.CALIBRATION_INVALID, "every input needs the same number of samples (> 0); got "
                              + ", ".join(f"{k}: {len(v)}" for k, v in out.items()))
    return out


def _check_dtype(spec: InputSpec, a: Any) -> None:
    """CALIBRATION_INVALID for data the input's dtype cannot take as it is: integers or booleans for a
    float input (token ids, or raw 0-255 pixels not prepared like the model's inputs: casting would
    calibrate on the wrong range without a word), floats with a fraction for an integer input, values
    outside the integer dtype's range, NaN or Inf."""
    import numpy as np

    want = np.dtype(spec.dtype)
    where = f"calibration array {spec.name!r} is {a.dtype}; the input takes {want}"
    if a.dtype.kind in "OSUV" or (a.dtype.kind != want.kind and want.kind in "OSUV"):
        raise FleetforgeError(Err.CALIBRATION_INVALID, where)
    if want.kind == "f" and a.dtype.kind in "biu":
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"{where}: integer data for a float input is refused (token ids, "
                              "or raw pixels not prepared like the model's inputs?); give the float values the model takes")
    if a.dtype.kind == "f" and a.size and not np.isfinite(a).all():
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"calibration array {spec.name!r} holds "
                              f"{int((~np.isfinite(a)).sum())} NaN/Inf value(s)")
    if want.kind in "biu" and a.size:
        if a.dtype.kind == "f" and not np.array_equal(a, np.round(a)):
            raise FleetforgeError(Err.CALIBRATION_INVALID, f"{where}: its values have fractions (an integer input takes "
                                  "whole numbers)")
        low, high = (0, 1) if want.kind == "b" else (np.iinfo(want).min, np.iinfo(want).max)
        lo, hi = a.min(), a.max()
        if lo < low or hi > high:
            raise FleetforgeError(Err.CALIBRATION_INVALID, f"{where}: its values span [{lo}, {hi}], outside {want}'s "
                                  f"[{low}, {high}]")


def check_values(stacked: dict[str, Any], model: Path) -> None:
    """CALIBRATION_INVALID for values the model's own ops say cannot be right: indices outside the axis
    they index (Gather on a 512-row embedding fed 600), a float input of Log/Sqrt/... outside its domain,
    an integer mask that is not 0/1. Roles as the synthetic data reads them (`_roles`)."""
    import numpy as np

    specs = {s.name: s for s in graph_inputs(model)}
    roles = _roles(model, set(specs))
    for name, a in stacked.items():
        role, detail = roles.get(name, ("any", None))
        if not np.size(a) or name not in specs:
            continue
        lo, hi = float(np.min(a)), float(np.max(a))
        bad = ""
        if role == "index" and isinstance(detail, int) and (lo < -detail or hi >= detail):
            bad = f"indices span [{lo:g}, {hi:g}]; the axis they index has {detail} entries"
        elif role == "positive" and lo <= 0:
            bad = f"values reach {lo:g}; the op it feeds takes positive values only"
        elif role == "unit" and (lo < -1 or hi > 1):
            bad = f"values span [{lo:g}, {hi:g}]; the op it feeds takes [-1, 1]"
        elif role == "above_one" and lo < 1:
            bad = f"values reach {lo:g}; the op it feeds takes values >= 1"
        elif _is_mask(specs[name], role) and np.asarray(a).dtype.kind in "iu" and not np.isin(a, (0, 1)).all():
            bad = f"mask values span [{lo:g}, {hi:g}]; a mask holds 0 and 1"
        if bad:
            raise FleetforgeError(Err.CALIBRATION_INVALID, f"calibration array {name!r}: {bad}")


def _fits(have: tuple[int, ...], want: list[int]) -> bool:
    """Static dims must match; a dim the model leaves symbolic (1 here) takes any size."""
    return len(have) == len(want) and all(w in (1, h) for h, w in zip(have, want))


def feeds_from(stacked: dict[str, Any], limit: int | None = None) -> list[Feed]:
    n = min(len(v) for v in stacked.values())
    n = n if limit is None else min(n, limit)
    return [{k: v[i] for k, v in stacked.items()} for i in range(n)]


def calibration_feeds(npz: Path, model: Path, limit: int | None = None) -> list[Feed]:
    """The samples of a canonical calibration .npz for `model`'s inputs (checked against them)."""
    stacked = samples_of(read_npz(npz), graph_inputs(model))
    check_values(stacked, model)
    return feeds_from(stacked, limit)


def write_npz(arrays: dict[str, Any], dest: Path) -> str:
    """Write `arrays` as an .npz whose bytes depend only on the arrays (sorted names, fixed zip
    timestamps); returns its sha256."""
    import numpy as np

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            data = io.BytesIO()
            np.lib.format.write_array(data, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, data.getvalue())
    raw = buf.getvalue()
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


def ingest(source: Path, model: Path, workspace_root: Path) -> tuple[str, str, int, list[str]]:
    """Check `source` against `model` and store it canonically in the workspace as
    `input/calibration_<sha256[:16]>.npz`; returns (relative path, sha256, samples, input names)."""
    specs = _data_inputs(model, [source])
    stacked = _load(source, specs, "calibration data", model)
    rel, sha = _store(stacked, workspace_root, "calibration")
    return rel, sha, min(len(v) for v in stacked.values()), [s.name for s in specs]


@dataclass(frozen=True)
class Ingested:
    """The user's data in the workspace: what calibrates and what the gate grades, never overlapping."""

    calibration: str | None
    calibration_sha256: str
    calibration_samples: int
    evaluation: str | None
    evaluation_samples: int
    held_out: bool
    inputs: list[str]


def ingest_split(source: Path | None, model: Path, workspace_root: Path, *, eval_source: Path | None,
                 eval_samples: int) -> Ingested:
    """Store the calibration data and the evaluation data canonically (`input/calibration_<sha>.npz`,
    `input/evaluation_<sha>.npz`): a separate `eval_source` as it is, after checking that none of its
    samples is a calibration sample (EVALUATION_NOT_HELD_OUT); else a held-out part of `source`
    (split_held_out) that the calibration part no longer holds."""
    specs = _data_inputs(model, [p for p in (source, eval_source) if p is not None])
    names = [s.name for s in specs]
    stacked = _load(source, specs, "calibration data", model) if source is not None else None
    if eval_source is not None:
        evaluation = _load(eval_source, specs, "evaluation data", model)
        if stacked is not None:
            shared = overlap(feeds_from(evaluation), feeds_from(stacked))
            if shared:
                raise FleetforgeError(Err.EVALUATION_NOT_HELD_OUT, f"{shared} of {len(feeds_from(evaluation))} samples of "
                                      f"the evaluation data ({eval_source.name}) are also in the calibration data "
                                      f"({source.name if source else '-'}): a gate on samples the quantizer saw proves "
                                      "nothing; give evaluation samples that are not calibration samples")
        held_out = False
    elif stacked is not None:
        _, whole = _store(stacked, workspace_root, "calibration", keep=False)
        stacked, evaluation = split_held_out(stacked, eval_samples, whole)
        held_out = True
    else:
        raise FleetforgeError(Err.CALIBRATION_INVALID, "no calibration or evaluation data to ingest")
    cal_rel, cal_sha = _store(stacked, workspace_root, "calibration") if stacked is not None else (None, "")
    eval_rel, _ = _store(evaluation, workspace_root, "evaluation")
    return Ingested(calibration=cal_rel, calibration_sha256=cal_sha,
                    calibration_samples=min(len(v) for v in stacked.values()) if stacked is not None else 0,
                    evaluation=eval_rel, evaluation_samples=min(len(v) for v in evaluation.values()),
                    held_out=held_out, inputs=names)


def _data_inputs(model: Path, sources: list[Path]) -> list[InputSpec]:
    """The inputs the data must feed: an ONNX model's graph inputs. A PyTorch model (.pt/.pt2) has no
    ONNX yet (a plan step exports it): the first data file's arrays, taken as [N, *shape], stand in,
    and the quantizer and the evaluation check the data against the exported ONNX (calibration_feeds)."""
    if _is_onnx(model):
        return graph_inputs(model)
    import numpy as np

    arrays = read_npz(next((p for p in sources if p.exists()), model))
    return [InputSpec(name, list(np.shape(a)[1:]), np.asarray(a).dtype, batch_free=False) for name, a in sorted(arrays.items())]


def _is_onnx(model: Path) -> bool:
    """Not a PyTorch file (.pt/.pt2/.pth or a zip archive): an ONNX model whose inputs can be read."""
    return model.suffix.lower() not in (".pt", ".pt2", ".pth") and not (model.is_file() and zipfile.is_zipfile(model))


def _load(source: Path, specs: list[InputSpec], what: str, model: Path) -> dict[str, Any]:
    """The data's samples for `specs`, their values checked against an ONNX model's ops (a PyTorch model's
    once it is exported: calibration_feeds)."""
    if not source.exists():
        raise FleetforgeError(Err.CALIBRATION_INVALID, f"{what} {source} does not exist")
    stacked = samples_of(read_npz(source), specs)
    if _is_onnx(model):
        check_values(stacked, model)
    return stacked


def _store(stacked: dict[str, Any], workspace_root: Path, prefix: str, *, keep: bool = True) -> tuple[str, str]:
    """(workspace-relative path, sha256) of `stacked` written canonically as `input/<prefix>_<sha[:16]>.npz`."""
    tmp = workspace_root / "input" / f".{prefix}.tmp.npz"
    sha = write_npz(stacked, tmp)
    rel = f"input/{prefix}_{sha[:16]}.npz"
    if keep:
        tmp.replace(workspace_root / rel)
    else:
        tmp.unlink()
    return rel, sha
