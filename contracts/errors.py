"""Stable error codes: `ApplicationError.type` in activities, `Failure.code` in results, CLI remedies."""

from __future__ import annotations

from enum import StrEnum


class Err(StrEnum):
    # inputs
    BAD_INPUT = "BAD_INPUT"
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
    MODEL_INVALID = "MODEL_INVALID"
    CATALOG_INVALID = "CATALOG_INVALID"
    # storage
    STORE_URL_INVALID = "STORE_URL_INVALID"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    ARTIFACT_NOT_FOUND = "ARTIFACT_NOT_FOUND"
    INTEGRITY_ERROR = "INTEGRITY_ERROR"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    PATH_ESCAPE = "PATH_ESCAPE"
    STORE_NOT_SHARED = "STORE_NOT_SHARED"
    """The client uploaded an input to a store this worker cannot see (a file:// store on another machine)."""
    # temporal / client
    TEMPORAL_UNAVAILABLE = "TEMPORAL_UNAVAILABLE"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    JOB_CANCELLED = "JOB_CANCELLED"
    JOB_FINISHED = "JOB_FINISHED"
    # llm
    LLM_UNAVAILABLE = "LLM_UNAVAILABLE"
    LLM_RETRYABLE = "LLM_RETRYABLE"
    LLM_BAD_REQUEST = "LLM_BAD_REQUEST"
    LLM_AUTH = "LLM_AUTH"
    LLM_STREAM_INCOMPLETE = "LLM_STREAM_INCOMPLETE"
    LLM_OUTPUT_INVALID = "LLM_OUTPUT_INVALID"
    LLM_CONTEXT_LENGTH = "LLM_CONTEXT_LENGTH"
    """The prompt (plus max_tokens) does not fit the model's context window: asking again cannot help."""
    LLM_QUOTA = "LLM_QUOTA"
    """The account is out of quota or credit (429 insufficient_quota): not a rate limit, waiting does not help."""
    LLM_RATE_LIMITED = "LLM_RATE_LIMITED"
    """The endpoint asked to wait longer (retry-after) than the worker's cap (FLEETFORGE_LLM_MAX_RETRY_AFTER_S)."""
    # convert
    PLAN_INVALID = "PLAN_INVALID"
    COMPILER_ERROR = "COMPILER_ERROR"
    EXECUTOR_ERROR = "EXECUTOR_ERROR"
    EVALUATION_ERROR = "EVALUATION_ERROR"
    REPLANS_EXHAUSTED = "REPLANS_EXHAUSTED"
    TOOLCHAIN_UNAVAILABLE = "TOOLCHAIN_UNAVAILABLE"
    NEEDS_INPUT_TIMEOUT = "NEEDS_INPUT_TIMEOUT"
    TOOL_CRASHED = "TOOL_CRASHED"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    EVALUATION_CRASHED = "EVALUATION_CRASHED"
    UNSUPPORTED_OP = "UNSUPPORTED_OP"
    ACCURACY_BELOW_THRESHOLD = "ACCURACY_BELOW_THRESHOLD"
    NOT_FULLY_OFFLOADED = "NOT_FULLY_OFFLOADED"
    CALIBRATION_INVALID = "CALIBRATION_INVALID"
    NOTHING_TO_QUANTIZE = "NOTHING_TO_QUANTIZE"
    CALIBRATION_NEEDED = "CALIBRATION_NEEDED"
    QUANT_SCALE_INVALID = "QUANT_SCALE_INVALID"
    """A quantization scale came out non-finite or absurd (a mask constant of float32 min in the range)."""
    INPUT_SHAPE_NEEDED = "INPUT_SHAPE_NEEDED"
    """A PyTorch model's input shapes are not recorded (TorchScript) or dynamic: --input-shape gives them."""
    EVALUATION_NOT_HELD_OUT = "EVALUATION_NOT_HELD_OUT"
    """An evaluation sample is also a calibration sample: a gate on in-sample data proves nothing."""
    HTP_GRAPH_REJECTED = "HTP_GRAPH_REJECTED"
    """The QNN HTP backend took every op, then failed to finalize the graph (a pattern it cannot build)."""
    NO_MIXED_PRECISION = "NO_MIXED_PRECISION"
    """Even every layer at 16-bit activations leaves an int8 model below the gate: its 8-bit weights lost it."""
    # kernel
    KERNEL_TASK_INVALID = "KERNEL_TASK_INVALID"
    WORKFLOW_CONFIG_INVALID = "WORKFLOW_CONFIG_INVALID"
    VERIFIER_ERROR = "VERIFIER_ERROR"
    MAX_STEPS = "MAX_STEPS"
    PARSE_FAILED = "PARSE_FAILED"
    NO_OPTIONS = "NO_OPTIONS"
    NOT_VERIFIED = "NOT_VERIFIED"
    NO_OFFLINE_TEMPLATE = "NO_OFFLINE_TEMPLATE"
    NO_PROGRESS = "NO_PROGRESS"
    REPEAT_LIMIT = "REPEAT_LIMIT"
    # fleet
    MANIFEST_INVALID = "MANIFEST_INVALID"
    POLICY_REJECTED = "POLICY_REJECTED"
    RUNNER_UNAVAILABLE = "RUNNER_UNAVAILABLE"
    ROWS_FAILED = "ROWS_FAILED"
    MANIFEST_CHANGED = "MANIFEST_CHANGED"
    HOST_LACKS_GPUS = "HOST_LACKS_GPUS"
    # sandbox
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
    """The worker cannot confine a child (bubblewrap missing, namespaces refused): untrusted code does not run."""
    # anything else
    INTERNAL = "INTERNAL"


REMEDY: dict[Err, str] = {
    Err.INTERNAL: ("the worker hit an error fleetforge does not classify: its log has the traceback (search it for the "
                   "job id); a file, permission or disk named in the message is the worker machine's to fix, anything "
                   "else is a fleetforge bug to report with that traceback"),
    Err.BAD_INPUT: "check the arguments (fleetforge COMMAND --help)",
    Err.MODEL_NOT_FOUND: "check the path, or add the model to the catalog (FLEETFORGE_CATALOG)",
    Err.MODEL_INVALID: "the file is not a readable model of a supported format (onnx, tflite, pb, pt)",
    Err.CATALOG_INVALID: "fix the catalog YAML: a mapping `models: {name: {path: ...}}`",
    Err.STORE_URL_INVALID: "set FLEETFORGE_STORE_URL to file:///ABS/PATH or s3://BUCKET[/PREFIX]",
    Err.STORE_UNAVAILABLE: "check FLEETFORGE_S3_ENDPOINT and the AWS_* credentials, and that the bucket exists",
    Err.STORE_NOT_SHARED: "give the client and every worker one shared store: FLEETFORGE_STORE_URL=s3://BUCKET/PREFIX (and FLEETFORGE_S3_ENDPOINT)",
    Err.TEMPORAL_UNAVAILABLE: "start the embedded stack with `fleetforge dev`, or set TEMPORAL_ADDRESS (or a `temporal config` profile)",
    Err.JOB_NOT_FOUND: "list jobs with `fleetforge list`",
    Err.JOB_FINISHED: "see how it ended with `fleetforge show JOB_ID`",
    Err.LLM_UNAVAILABLE: "set FLEETFORGE_LLM_BASE_URL / FLEETFORGE_LLM_API_KEY, run `fleetforge dev --llm local`, or use FLEETFORGE_LLM=offline",
    Err.LLM_AUTH: "check FLEETFORGE_LLM_API_KEY (or OPENAI_API_KEY)",
    Err.LLM_CONTEXT_LENGTH: "the prompt does not fit the model's context window: use a model with a longer context",
    Err.LLM_QUOTA: "the LLM account is out of quota: add credit, use another key (FLEETFORGE_LLM_API_KEY) or FLEETFORGE_LLM=offline",
    Err.LLM_RATE_LIMITED: "the endpoint asked to wait longer than FLEETFORGE_LLM_MAX_RETRY_AFTER_S: raise it, or run the job later",
    Err.TOOLCHAIN_UNAVAILABLE: "install the extra the message names where the worker runs, or set QAIRT_SDK_ROOT for the QAIRT CLIs",
    Err.EXECUTOR_ERROR: "see logs/last_error.json in the run's workspace; try another --precision or --preset",
    Err.COMPILER_ERROR: "the plan does not fit the tools: see the message, or start a new conversion without --rerun",
    Err.TOOL_CRASHED: "a native tool crashed (the worker is fine): try another --precision or --soc, or report the model",
    Err.TOOL_TIMEOUT: "the tool ran past its time limit: try --preset fast, or a smaller model",
    Err.EVALUATION_CRASHED: "the artifacts are attached but unevaluated (the x86 HTP emulator crashed): check them on a device",
    Err.UNSUPPORTED_OP: "the named op has no HTP implementation: use --output onnx_qdq or ort, or replace the op (graph passes: fleetforge's onnx.graph_passes tool)",
    Err.QUANT_SCALE_INVALID: "a constant far outside the data's range (a mask of float32 min) broke the named scale: the clamp_mask_constants graph pass fixes it, or use --precision fp16",
    Err.INPUT_SHAPE_NEEDED: "give every input's shape: --input-shape NAME=1,3,224,224 (add :int64 for token ids)",
    Err.ACCURACY_BELOW_THRESHOLD: "give real inputs with --calibration, try --precision w8a16/fp16, or accept it with --min-cosine 0",
    Err.NOT_FULLY_OFFLOADED: "the named ops run on the CPU: the message names the graph pass that rewrites them when there is one; else re-export without them, or use --output onnx_qdq / ort",
    Err.NOTHING_TO_QUANTIZE: "the model has no float math the quantizer can take: convert it with --precision fp16",
    Err.CALIBRATION_INVALID: "--calibration takes an .npz (input name -> array) or a folder of them matching the model's inputs",
    Err.CALIBRATION_NEEDED: "give real inputs with --calibration FILE.npz (input name -> array) for the named inputs",
    Err.HTP_GRAPH_REJECTED: "the HTP backend could not build the graph: the offline planner tries the graph passes for it; "
                            "else use --output onnx_qdq / ort, or report the model",
    Err.NO_MIXED_PRECISION: "16-bit activations cannot rescue the 8-bit weights: convert with --precision fp16, or accept the result with --min-cosine",
    Err.EVALUATION_NOT_HELD_OUT: "give --eval-data with samples that are not in the calibration data, or more calibration samples so some can be held out",
    Err.WORKFLOW_CONFIG_INVALID: "fix the workflow.yaml named in the message",
    Err.SANDBOX_UNAVAILABLE: "install bubblewrap on the worker (apt-get install bubblewrap) and allow namespaces; "
                             "FLEETFORGE_SANDBOX=off runs untrusted code unconfined (every job then says so)",
    Err.MANIFEST_INVALID: "the CSV needs a header with at least model_name,status,note",
    Err.ROWS_FAILED: "see the per-model table: No = the model failed, Error = it could not be tested; rerun the CSV to retest the Error rows",
    Err.MANIFEST_CHANGED: "give the CSV the fleet started from, or pass --force to merge the verdicts into this one by model name",
    Err.HOST_LACKS_GPUS: "give the profile (--hardware) and the rows' gpus cells at most the GPUs this host has "
                         "(fleet-test prints them), or start the fleet on a host that has the GPUs",
    Err.MAX_STEPS: "raise --max-step, or configure an LLM (FLEETFORGE_LLM_BASE_URL) for ops the offline coder cannot write",
    Err.NO_OFFLINE_TEMPLATE: "configure an LLM (FLEETFORGE_LLM_BASE_URL) to write kernels for these aten ops",
    Err.NO_PROGRESS: "configure an LLM (FLEETFORGE_LLM_BASE_URL), or a different workflow.yaml: the offline coder can only repeat its rejected candidate",
    Err.REPEAT_LIMIT: "raise the repeat limit named in the message in the workflow.yaml, or configure an LLM",
    Err.KERNEL_TASK_INVALID: "fix the task file named in the message (KernelBench format: Model, get_inputs, get_init_inputs), or shrink it with --set NAME=VALUE",
}


def clip(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` characters, cut at a word boundary with an ellipsis (never
    mid-word: a cut identifier reads as a different one)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 1)]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def remedy(code: str) -> str:
    """What the user should do about an error code; empty when we have nothing useful to say."""
    try:
        return REMEDY.get(Err(code), "")
    except ValueError:
        return ""


def explained(message: str, code: str, hint: str = "") -> str:
    """`message (what to do)`: the job's own `hint`, else the code's remedy, appended unless the message
    already gives it (a specific message such as "give real inputs with --calibration FILE.npz ('k' -> array)")."""
    fix = hint or remedy(code)
    gist = fix.split(" (", 1)[0].lower()
    return message if not fix or gist in message.lower() else f"{message} ({fix})"


class FleetforgeError(Exception):
    """A failure with a stable code. The worker's interceptor turns it into an ApplicationError
    (type=code), so library code below activities never imports temporalio."""

    def __init__(self, code: Err, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable

    def __str__(self) -> str:
        return self.message
