"""Error taxonomy over realistic vLLM / TGI / docker log tails."""

from __future__ import annotations

import pytest

from activities.containers.taxonomy import classify
from contracts.fleet import ErrorCategory as C
from contracts.fleet import Remedy as R
from contracts.fleet import TestPhase as P

VLLM_ARGS = (
    "INFO 11-20 10:01:02 api_server.py:528] vLLM API server version 0.6.3\n"
    "INFO 11-20 10:01:02 api_server.py:529] args: Namespace(host='127.0.0.1', port=8000, "
    "model='Qwen/Qwen2-72B', trust_remote_code=True, max_model_len=None, gpu_memory_utilization=0.9)\n"
)

CUDA_OOM = VLLM_ARGS + """\
INFO 11-20 10:01:40 model_runner.py:1056] Starting to load model Qwen/Qwen2-72B...
ERROR 11-20 10:02:11 engine.py:366]   File "/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py", line 1326, in convert
ERROR 11-20 10:02:11 engine.py:366] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 462.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 301.06 MiB is free.
Process SpawnProcess-1:
"""

KV_CACHE = """\
INFO 11-20 10:05:12 gpu_executor.py:122] # GPU blocks: 1279, # CPU blocks: 2048
INFO 11-20 10:05:12 gpu_executor.py:126] Maximum concurrency for 32768 tokens per request: 0.62x
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py", line 465, in raise_if_cache_size_invalid
    raise ValueError(
ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (20464). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""

UNSUPPORTED = """\
INFO 11-20 11:00:00 config.py:1652] Downcasting torch.float32 to torch.float16.
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/registry.py", line 343, in _raise_for_unsupported
    raise ValueError(
ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported architectures: dict_keys(['AquilaModel', 'LlamaForCausalLM'])
"""

TRUST = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/transformers/dynamic_module_utils.py", line 678, in resolve_trust_remote_code
ValueError: The repository for internlm/internlm2-chat-7b contains custom code which must be executed to correctly load the model. You can inspect the repository content at https://hf.co/internlm/internlm2-chat-7b.
Please pass the argument `trust_remote_code=True` to allow custom code to be run.
"""

GATED_401 = """\
huggingface_hub.utils._errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6731)
Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/resolve/main/config.json.
Access to model meta-llama/Llama-3.1-8B-Instruct is restricted. You must be authenticated to access it.
"""

FORBIDDEN_403 = "requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: https://huggingface.co/api/models/org/private\n"

IMAGE = """\
Unable to find image 'vllm/vllm-openai:v9.9.9' locally
docker: Error response from daemon: manifest for vllm/vllm-openai:v9.9.9 not found: manifest unknown: manifest unknown.
See 'docker run --help'.
"""

PORT_VLLM = """\
INFO:     Started server process [1]
INFO:     Waiting for application startup.
ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use
INFO:     Waiting for application shutdown.
"""

PORT_TGI = """\
2024-11-20T10:00:00.000000Z  INFO text_generation_router::server: router/src/server.rs:1876: Connected
Error: Io(Os { code: 98, kind: AddrInUse, message: "Address in use" })
"""

DAEMON = "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n"


@pytest.mark.parametrize("exit_code, log, phase, category, remedy, snippet", [
    (1, CUDA_OOM, P.START, C.CUDA_OOM, R.NEW_COMMAND, "CUDA out of memory"),
    (1, KV_CACHE, P.START, C.CUDA_OOM, R.NEW_COMMAND, "KV cache"),
    (1, UNSUPPORTED, P.START, C.UNSUPPORTED_ARCH, R.HUMAN, "FooForCausalLM"),
    (1, TRUST, P.START, C.TRUST_REMOTE_CODE, R.NEW_COMMAND, "custom code"),
    (1, GATED_401, P.START, C.AUTH, R.HUMAN, "401"),
    (1, FORBIDDEN_403, P.START, C.AUTH, R.HUMAN, "403"),
    (125, IMAGE, P.START, C.IMAGE_NOT_FOUND, R.NEW_COMMAND, "Unable to find image"),
    (1, PORT_VLLM, P.START, C.PORT_IN_USE, R.HUMAN, "address already in use"),
    (1, PORT_TGI, P.START, C.PORT_IN_USE, R.HUMAN, "Address in use"),
    (125, DAEMON, P.START, C.DOCKER_UNREACHABLE, R.NEW_COMMAND, "docker daemon"),
])
def test_log_patterns(exit_code: int, log: str, phase: P, category: C, remedy: R, snippet: str) -> None:
    c = classify(exit_code, log, phase)
    assert (c.category, c.remedy) == (category, remedy)
    assert snippet in c.reason
    assert "\n" not in c.reason and len(c.reason) <= 220


def test_args_echo_with_trust_remote_code_does_not_hide_an_oom() -> None:
    # vLLM prints its arguments (trust_remote_code=True) before failing for another reason
    assert classify(1, CUDA_OOM, P.START).category is C.CUDA_OOM


def test_kv_cache_facts_are_extracted_for_repairs() -> None:
    c = classify(1, KV_CACHE, P.START)
    assert c.facts == {"max_seq_len": "32768", "kv_tokens": "20464"}


def test_port_fact_is_extracted() -> None:
    assert classify(1, PORT_VLLM, P.START).facts.get("port") == "8000"


@pytest.mark.parametrize("exit_code, words", [(137, "SIGKILL"), (139, "segmentation"), (125, "code 125")])
def test_exit_codes_without_a_known_log_are_crashes(exit_code: int, words: str) -> None:
    """A container's own exit code (no line of the runner saying the engine refused `docker run`)."""
    c = classify(exit_code, "INFO starting\nINFO loading weights\n", P.START)
    assert c.category is C.CRASHED and c.remedy is R.NEW_COMMAND and words in c.reason
    assert c.facts["exit_code"] == str(exit_code)


def test_oom_log_wins_over_exit_137() -> None:
    assert classify(137, CUDA_OOM, P.START).category is C.CUDA_OOM


def test_other_nonzero_exit_reports_the_last_log_line() -> None:
    c = classify(3, "INFO a\nRuntimeError: something odd happened\n\n", P.START)
    assert c.category is C.CRASHED and "exit" in c.reason and "something odd happened" in c.reason


def test_phases_without_a_known_log() -> None:
    assert classify(None, "INFO loading\n", P.HEALTH).category is C.NOT_HEALTHY
    assert classify(None, "", "probe").category is C.PROBE_FAILED
    assert classify(None, "", P.START).category is C.UNKNOWN
    c = classify(None, "command rejected: --privileged is not allowed", P.POLICY)
    assert c.category is C.POLICY_REJECTED and "--privileged" in c.reason and c.remedy is R.NEW_COMMAND


def test_health_phase_still_recognises_a_known_cause() -> None:
    assert classify(None, KV_CACHE, P.HEALTH).category is C.CUDA_OOM


def test_a_test_that_did_not_finish_in_time_is_a_timeout() -> None:
    c = classify(None, "loading...\n[fleetforge] did not finish within 30s (--test-timeout); killed", P.TIMEOUT)
    assert c.category is C.TIMEOUT and "--test-timeout" in c.reason
    assert classify(None, CUDA_OOM, P.TIMEOUT).category is C.CUDA_OOM, "a known cause in the log still wins"


def test_a_server_that_is_not_the_rows_own_is_a_foreign_server_for_a_person() -> None:
    log = "serving\n[fleetforge] probe: the server on port 8001 lists ['org/other'], not 'org/mine'"
    c = classify(None, log, P.IDENTITY)
    assert c.category is C.FOREIGN_SERVER and c.remedy is R.HUMAN
    assert c.reason.startswith("the server on this row's port is not provably the row's own: stop whatever")
    assert "lists ['org/other']" in c.reason


def test_a_busy_slot_port_says_what_to_do_first() -> None:
    c = classify(None, "[fleetforge] address already in use: 127.0.0.1:9000, this row's port, is held", P.START)
    assert c.category is C.PORT_IN_USE and c.remedy is R.HUMAN
    assert c.reason.startswith("port in use: another process holds this row's port; stop it or change port_range")


def test_the_rows_own_server_listing_another_model_is_the_models_mismatch_with_the_ids_seen() -> None:
    """The command deployed the wrong thing: the model's No, what it lists and what to do, even when the
    command printed a line that looks like ours before (the runner's own line comes last)."""
    log = ("[fleetforge] model mismatch: fake\nserving\n[fleetforge] model mismatch: the row's server lists "
           "['someone/else'], not 'acme/liar-1b': its command deployed another model (serve acme/liar-1b, or name "
           "its weights --served-model-name acme/liar-1b)")
    c = classify(None, log, P.MISMATCH)
    assert c.category is C.MODEL_MISMATCH and c.remedy is R.NEW_COMMAND
    assert c.reason.startswith("the row's server lists ['someone/else'], not 'acme/liar-1b'"), c.reason


def test_a_path_our_sandbox_hides_is_our_error_naming_the_path_and_the_share() -> None:
    log = ("python3: can't open file '/tmp/x/fake_llm.py': [Errno 2] No such file or directory\n"
           "[fleetforge] hidden by the sandbox: /tmp/x/fake_llm.py: rerun with --share /tmp/x (the command sees ...)")
    c = classify(2, log, P.HIDDEN)
    assert c.category is C.SANDBOX_HIDDEN and c.remedy is R.HUMAN
    assert c.reason.startswith("/tmp/x/fake_llm.py: rerun with --share /tmp/x"), c.reason


def test_a_server_command_that_exits_before_serving_is_not_healthy_and_names_self_test() -> None:
    log = "hello\n[fleetforge] the command exited (code 0) before a server answered on port 8001: a server keeps ..."
    c = classify(None, log, P.HEALTH)
    assert c.category is C.NOT_HEALTHY and "--process-mode self-test" in c.reason
