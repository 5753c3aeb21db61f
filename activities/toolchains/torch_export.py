"""PyTorch in: the `torch.export_onnx` tool step (TorchScript `.pt` / ExportedProgram `.pt2` -> ONNX) and
the torch module as the evaluation's reference.

Both load a user's file into torch (TorchScript runs its own code): they run in the tool/evaluation
child process like every native step. The exporter and opset used are recorded in the ONNX file's
metadata (`fleetforge.exporter`, `fleetforge.torch`) and in the step's details.

* ExportedProgram: its input shapes are recorded; exported as it is (torch.onnx.export(ep)). A dynamic
  dim needs --input-shape: the program's module is then exported at those sizes.
* TorchScript: no shapes are recorded, so every input needs --input-shape (NAME from the forward
  signature, `:int64` for ids); torch.export cannot trace a ScriptModule, so the TorchScript exporter
  (dynamo=False) writes it.
The ONNX is written as one file (weights inline) up to protobuf's 2 GiB; larger stays external.
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from activities.sandbox import safe_join
from contracts.convert import StepOutput
from contracts.errors import Err, FleetforgeError

MAX_INLINE_BYTES = 2 * 1024**3 - 64 * 1024**2
"""Below protobuf's 2 GiB limit, with room for the graph itself."""
DTYPES = {"float32": "float32", "float16": "float16", "int64": "int64", "int32": "int32", "bool": "bool"}


class TorchExportParams(BaseModel, frozen=True):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    """Workspace-relative .pt (TorchScript) or .pt2 (ExportedProgram)."""
    output: str
    input_shapes: list[str] = []
    """NAME=d1,d2,...[:dtype] per input (contracts.convert_job.parse_input_shape)."""
    opset: int | None = None
    """None: the exporter's default opset."""


def _load(path: Path) -> tuple[str, Any]:
    """("exported_program" | "torchscript", the loaded object)."""
    import torch

    from activities.modelhub import torch_format
    from contracts.models import ModelFormat

    fmt = torch_format(path)
    try:
        if fmt is ModelFormat.TORCH_EXPORT:
            return "exported_program", torch.export.load(str(path))
        return "torchscript", torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as e:
        from activities.toolchains.isolate import tidy

        raise FleetforgeError(Err.MODEL_INVALID, f"torch cannot load {path.name}: {tidy(str(e), 300)}") from e


def input_specs(kind: str, obj: Any, given: dict[str, Any]) -> list[tuple[str, list[int], str]]:
    """(name, dims, dtype) of every input, from the file where it records them and --input-shape where
    it does not; INPUT_SHAPE_NEEDED names what is missing."""
    names = list(obj.graph_signature.user_inputs) if kind == "exported_program" else \
        [a.name for a in obj.forward.schema.arguments[1:]]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise FleetforgeError(Err.BAD_INPUT, f"--input-shape names no input of the model: {', '.join(unknown)} "
                              f"(its inputs: {', '.join(names)})")
    if kind == "exported_program":
        user = names
        metas = {n.name: n.meta.get("val") for n in obj.graph.nodes if n.op == "placeholder"}
        out, missing = [], []
        for name in user:
            val = metas.get(name)
            dims = [int(d) if isinstance(d, int) else None for d in getattr(val, "shape", [])]
            dtype = str(getattr(val, "dtype", "torch.float32")).removeprefix("torch.")
            if name in given:
                out.append((name, list(given[name].dims), given[name].dtype if name in given else dtype))
            elif None in dims or val is None:
                missing.append(f"{name} (dims {['?' if d is None else d for d in dims]})")
            else:
                out.append((name, dims, dtype))
        if missing:
            raise FleetforgeError(Err.INPUT_SHAPE_NEEDED, f"the ExportedProgram has dynamic input dims: {', '.join(missing)}; "
                                  "give --input-shape NAME=d1,d2,... for each")
        return out
    missing = [n for n in names if n not in given]
    if missing:
        raise FleetforgeError(Err.INPUT_SHAPE_NEEDED, f"TorchScript records no input shapes: give --input-shape for "
                              f"{', '.join(missing)} (e.g. {missing[0]}=1,3,224,224, or {missing[0]}=1,128:int64 for ids)")
    return [(n, list(given[n].dims), given[n].dtype) for n in names]


def example_inputs(specs: list[tuple[str, list[int], str]], seed: int = 0) -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _, dims, dtype in specs:
        if dtype in ("int64", "int32"):
            out.append(torch.zeros(dims, dtype=getattr(torch, dtype)))
        elif dtype == "bool":
            out.append(torch.ones(dims, dtype=torch.bool))
        else:
            out.append(torch.randn(dims, generator=g).to(getattr(torch, dtype)))
    return tuple(out)


EXPORT_PACKAGES = ("torch", "onnxscript")
"""The torch-export extra: torch loads the model, onnxscript is the ONNX exporter's (torch.onnx's default)."""


def export_onnx(root: Path, params: TorchExportParams) -> StepOutput:
    missing = [name for name in EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:  # the worker's problem: no replan or other --preset helps
        raise FleetforgeError(Err.TOOLCHAIN_UNAVAILABLE, f"exporting a PyTorch model to ONNX needs {' and '.join(missing)} "
                              "on the worker: install the torch-export extra where the worker runs (pip install "
                              "'fleetforge[torch-export]'; in a checkout `make setup`), then start the worker again")
    import onnx
    import torch

    from activities.toolchains.isolate import tidy
    from contracts.convert_job import parse_input_shape

    src, dst = safe_join(root, params.model), safe_join(root, params.output)
    if dst.suffix != ".onnx":
        raise FleetforgeError(Err.BAD_INPUT, f"the export's output must end in .onnx, got {params.output!r}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        given = dict(parse_input_shape(s) for s in params.input_shapes)
    except ValueError as e:
        raise FleetforgeError(Err.BAD_INPUT, str(e)) from e
    t0 = time.monotonic()
    kind, obj = _load(src)
    specs = input_specs(kind, obj, given)
    names = [n for n, _, _ in specs]
    opset = {"opset_version": params.opset} if params.opset else {}
    try:
        if kind == "exported_program" and not given:
            exporter = "torch.onnx.export(ExportedProgram), dynamo"
            torch.onnx.export(obj, (), str(dst), input_names=names, **opset)
        elif kind == "exported_program":
            exporter = "torch.onnx.export(ExportedProgram.module()), dynamo, at --input-shape sizes"
            with warnings.catch_warnings():
                # .module() is a new GraphModule, so its flag says training, but its graph holds the ops
                # torch.export captured (batch norm and dropout as the model ran then): nothing to warn of
                warnings.filterwarnings("ignore", "Exporting a model while it is in training mode")
                torch.onnx.export(obj.module(), example_inputs(specs), str(dst), input_names=names, **opset)
        else:
            exporter = "torch.onnx.export(ScriptModule), TorchScript exporter (dynamo=False)"
            torch.onnx.export(obj, example_inputs(specs), str(dst), input_names=names, dynamo=False, **opset)
    except FleetforgeError:
        raise
    except Exception as e:
        raise FleetforgeError(Err.EXECUTOR_ERROR, f"exporting {params.model} to ONNX failed ({kind}): "
                              f"{tidy(str(e).split(chr(10))[0] if 'Exception summary' not in str(e) else _summary(str(e)))}") from e
    model = onnx.load(str(dst))
    opset_used = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    meta = {"fleetforge.exporter": exporter, "fleetforge.torch": torch.__version__, "fleetforge.source": params.model}
    for k, v in meta.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    sidecar = dst.with_name(dst.name + ".data")
    outputs = [params.output]
    if model.ByteSize() < MAX_INLINE_BYTES:
        onnx.save(model, str(dst))
        sidecar.unlink(missing_ok=True)
    else:
        onnx.save(model, str(dst), save_as_external_data=True, location=sidecar.name)
        outputs.append(str(Path(params.output).with_name(sidecar.name)))
    return StepOutput(outputs=outputs, seconds=time.monotonic() - t0,
                      details={"exporter": exporter, "opset": opset_used, "torch": torch.__version__, "format": kind,
                               "inputs": {n: {"dims": d, "dtype": t} for n, d, t in specs}})


def _summary(text: str) -> str:
    """The "## Exception summary" paragraph of a torch.onnx error (the rest is advice to file an issue)."""
    after = text.split("Exception summary", 1)[1]
    return " ".join(line for line in after.splitlines() if line.strip() and not line.startswith("(Refer"))[:400]


class TorchReference:
    """The torch module with an onnxruntime session's face (`get_outputs`, `run`), so the evaluation
    takes its reference outputs from the model the user gave, not from our export of it."""

    def __init__(self, source: Path, exported: Any):
        import torch

        kind, obj = _load(source)
        self.module = obj.module() if kind == "exported_program" else obj
        self.exported = exported
        self.names = [i.name for i in exported.get_inputs()]
        self._torch = torch

    def get_outputs(self) -> Any:
        return self.exported.get_outputs()

    def get_inputs(self) -> Any:
        return self.exported.get_inputs()

    def get_providers(self) -> list[str]:
        return ["torch"]

    def run(self, _names: Any, feed: dict[str, Any]) -> list[Any]:
        torch = self._torch
        args = [torch.from_numpy(feed[n].copy()) for n in self.names]
        with torch.no_grad():
            out = self.module(*args)
        flat: list[Any] = []

        def walk(x: Any) -> None:
            if isinstance(x, torch.Tensor):
                flat.append(x.detach().cpu().numpy())
            elif isinstance(x, (list, tuple)):
                for y in x:
                    walk(y)
            elif isinstance(x, dict):
                for y in x.values():
                    walk(y)

        walk(out)
        return flat
