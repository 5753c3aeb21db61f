"""LLM call overhead: a call through Temporal (workflow -> `ask` -> `complete_chat` activity) against a
direct `openai` call, on the same local scripted server with simulated model latency, and then on the
REAL local llama.cpp server (SmolLM2-135M, the `local-llm` extra), in one run.

    .venv/bin/python -m bench.bench_llm [--rounds 8] [--latency-ms 200] [--real-rounds 6] [--no-real]

Starts the embedded Temporal dev server (the `temporal` binary, 127.0.0.1, random port), one
in-process worker (a one-call workflow plus the real `LLMActivities.complete_chat`, file store in a
temp dir) and the scripted OpenAI-compatible server (tests/doubles) that waits `--latency-ms` before
streaming a 20-chunk answer. Then alternates the two paths call by call (the order flips every
round, so drift on a shared machine hits both alike) and prints the medians, the ratio
temporal / direct, and PASS/FAIL against the target (ratio <= 1.3). Exit code 0 on PASS, 1 on FAIL.

The Temporal path is timed end to end at the client: start the workflow, its workflow task, the
activity (same streaming request, usage chunk, heartbeats, transcript written to the store), the
result.

The real-server row (client/local_llm.py starts llama.cpp on 127.0.0.1): the same greedy request
(temperature 0, a 41-token answer within max_tokens 64, unstreamed: llama.cpp streams carry no usage, so the activity asks it
unstreamed anyway) alternately direct and through the activity; prints ms per call, the ratio
(target <= 1.1) and completion tokens per second of wall time on each path.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio import workflow

from bench._dev_server import dev_server

with workflow.unsafe.imports_passed_through():
    from contracts.messages import ChatRequest, ChatResult, Message
    from workflows._llm import ask

TARGET_RATIO = 1.3
REAL_TARGET_RATIO = 1.1
REAL_MAX_TOKENS = 64
PARTS = [f"word{i} " for i in range(20)]


@workflow.defn(sandboxed=False)
class BenchAskWorkflow:
    """`calls` sequential LLM calls, as an agent loop makes them (each one `complete_chat` activity)."""

    @workflow.run
    async def run(self, req: ChatRequest, calls: int) -> list[ChatResult]:
        return [await ask(req, queue=workflow.info().task_queue, summary=f"bench: call {i + 1}") for i in range(calls)]


def _request() -> ChatRequest:
    return ChatRequest(messages=[Message.system("be brief"), Message.user("say twenty words")], agent="bench")


async def _direct_call(client, req: ChatRequest, model: str) -> str:
    """What a caller without Temporal would write: one streamed chat completion, consumed to the end."""
    from activities.llm.converters import to_openai_messages

    stream = await client.chat.completions.create(
        model=model, messages=to_openai_messages(req.messages), stream=True, stream_options={"include_usage": True},
    )
    text = []
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            text.append(c.choices[0].delta.content)
    return "".join(text)


def _row(name: str, xs: list[float]) -> str:
    p90 = statistics.quantiles(xs, n=10)[-1] if len(xs) >= 2 else xs[0]
    return f"{name:<52}{statistics.median(xs) * 1000:>10.1f}{p90 * 1000:>10.1f}{min(xs) * 1000:>10.1f}"


def _real_request(model: str) -> ChatRequest:
    return ChatRequest(messages=[Message.user("List the primary colours, one per line.")], model=model, agent="bench",
                       temperature=0.0, max_tokens=REAL_MAX_TOKENS, stream=False)


async def real_server_row(env, rounds: int, loop_calls: int, workdir: Path) -> bool:
    """Direct vs through the activity against the real llama.cpp server; prints the row, True on PASS."""
    import openai

    from activities.llm.activity import LLMActivities
    from activities.storage import FileStore
    from client.local_llm import LocalLLM
    from contracts.errors import FleetforgeError
    from contracts.settings import Settings
    from tests.helpers import new_worker

    try:
        server = LocalLLM.from_settings(Settings(state_dir=workdir / "llama", llm="local"))
    except FleetforgeError as e:
        print(f"real llama.cpp server: not run: {e.message}")
        return False
    server.start()
    try:
        await asyncio.to_thread(server.wait_ready)
        settings = server.settings_for(Settings(state_dir=workdir / "state-real", llm="openai"))
        llm = LLMActivities(settings, FileStore(workdir / "artifacts-real"))
        direct = openai.AsyncOpenAI(max_retries=0, base_url=server.base_url, api_key="unused")
        req = _real_request(server.model)
        direct_s: list[float] = []
        via_s: list[float] = []
        tps_direct: list[float] = []
        tps_via: list[float] = []
        async with new_worker(env.client, workflows=[BenchAskWorkflow], activities=[llm.complete_chat]) as worker:

            async def via_temporal() -> tuple[float, int]:
                t0 = time.perf_counter()
                results = await env.client.execute_workflow(
                    BenchAskWorkflow.run, args=[req, loop_calls], id=f"bench-llm-real/{uuid.uuid4().hex[:10]}",
                    task_queue=worker.task_queue)
                elapsed = time.perf_counter() - t0
                assert all(r.usage_reported and r.message.finish_reason == "stop" for r in results), "one whole answer each"
                return elapsed / loop_calls, sum(r.usage.completion for r in results)

            async def via_openai() -> tuple[float, int]:
                t0 = time.perf_counter()
                tokens = 0
                for _ in range(loop_calls):
                    r = await direct.chat.completions.create(model=server.model, messages=to_openai(req),
                                                             temperature=0.0, max_tokens=REAL_MAX_TOKENS)
                    assert r.choices[0].finish_reason == "stop", "the answer must fit max_tokens on both paths"
                    tokens += r.usage.completion_tokens
                return (time.perf_counter() - t0) / loop_calls, tokens

            warmup = 1
            for i in range(warmup + rounds):
                order = [("direct", via_openai), ("via", via_temporal)]
                measured = {name: await fn() for name, fn in (order if i % 2 == 0 else reversed(order))}
                if i >= warmup:
                    direct_s.append(measured["direct"][0])
                    via_s.append(measured["via"][0])
                    tps_direct.append(measured["direct"][1] / (measured["direct"][0] * loop_calls))
                    tps_via.append(measured["via"][1] / (measured["via"][0] * loop_calls))
        await direct.close()
    finally:
        await asyncio.to_thread(server.stop)
    ratio = statistics.median(via_s) / statistics.median(direct_s)
    print(f"real llama.cpp server ({server.model}, CPU), greedy answers (max_tokens {REAL_MAX_TOKENS}), unstreamed, "
          f"{rounds} alternating rounds of {loop_calls} calls")
    print(f"{'path (ms per call)':<52}{'median':>10}{'p90':>10}{'min':>10}")
    print(_row("direct openai (AsyncOpenAI)", direct_s))
    print(_row(f"temporal: ask -> complete_chat, {loop_calls} in one workflow", via_s))
    print(f"completion tokens per second of wall time: direct {statistics.median(tps_direct):.1f}, "
          f"through the activity {statistics.median(tps_via):.1f}")
    ok = ratio <= REAL_TARGET_RATIO
    print(f"ratio real LLM call through the activity / direct (medians): {ratio:.3f}  "
          f"target <= {REAL_TARGET_RATIO}: {'PASS' if ok else 'FAIL'}")
    return ok


def to_openai(req: ChatRequest) -> list[dict]:
    from activities.llm.converters import to_openai_messages

    return to_openai_messages(req.messages)


async def main_async(rounds: int, loop_calls: int, latency_ms: int, workdir: Path, real_rounds: int = 6) -> bool:
    import openai

    from activities.llm.activity import LLMActivities
    from activities.storage import FileStore
    from contracts.settings import Settings
    from tests.doubles.openai_server import ScriptedOpenAIServer, text_stream
    from tests.helpers import new_worker

    warmup = 2
    per_round = 2 * loop_calls + 1
    script = [text_stream(PARTS, delay_s=latency_ms / 1000) for _ in range((rounds + warmup) * per_round)]
    expected = "".join(PARTS)
    direct_s: list[float] = []
    loop_s: list[float] = []
    single_s: list[float] = []
    async with dev_server() as env:
        with ScriptedOpenAIServer(script) as server:
            settings = Settings(state_dir=workdir / "state", llm="openai", llm_base_url=server.base_url, llm_model="bench")
            llm = LLMActivities(settings, FileStore(workdir / "artifacts"))
            direct = openai.AsyncOpenAI(max_retries=0, base_url=server.base_url, api_key="unused")
            async with new_worker(env.client, workflows=[BenchAskWorkflow], activities=[llm.complete_chat]) as worker:

                async def via_temporal(calls: int) -> float:
                    """Wall time per call of one workflow making `calls` sequential calls (client clock)."""
                    t0 = time.perf_counter()
                    results = await env.client.execute_workflow(
                        BenchAskWorkflow.run, args=[_request(), calls], id=f"bench-llm/{uuid.uuid4().hex[:10]}",
                        task_queue=worker.task_queue,
                    )
                    elapsed = time.perf_counter() - t0
                    assert [r.message.text for r in results] == [expected] * calls
                    return elapsed / calls

                async def via_openai() -> float:
                    """Wall time per call of `loop_calls` sequential direct calls, measured like the loop."""
                    t0 = time.perf_counter()
                    texts = [await _direct_call(direct, _request(), "bench") for _ in range(loop_calls)]
                    elapsed = time.perf_counter() - t0
                    assert texts == [expected] * loop_calls
                    return elapsed / loop_calls

                paths = {"direct": via_openai, "loop": lambda: via_temporal(loop_calls), "single": lambda: via_temporal(1)}
                for i in range(warmup + rounds):
                    order = list(paths) if i % 2 == 0 else list(reversed(paths))  # drift hits every path alike
                    measured = {name: await paths[name]() for name in order}
                    if i >= warmup:
                        direct_s.append(measured["direct"])
                        loop_s.append(measured["loop"])
                        single_s.append(measured["single"])
            await direct.close()
        ok = _print_scripted(direct_s, loop_s, single_s, latency_ms=latency_ms, rounds=rounds, loop_calls=loop_calls)
        print()
        real_ok = await real_server_row(env, real_rounds, 3, workdir) if real_rounds else True
    return ok and real_ok


def _print_scripted(direct_s: list[float], loop_s: list[float], single_s: list[float], *, latency_ms: int,
                    rounds: int, loop_calls: int) -> bool:
    med_d, med_l, med_s = (statistics.median(x) for x in (direct_s, loop_s, single_s))
    ratio = med_l / med_d
    print(f"LLM call, {latency_ms} ms simulated latency, {len(PARTS)}-chunk streamed answer, {rounds} alternating rounds")
    print(f"{'path (ms per call)':<52}{'median':>10}{'p90':>10}{'min':>10}")
    print(_row(f"direct openai (AsyncOpenAI, streamed), {loop_calls} in a row", direct_s))
    print(_row(f"temporal: ask -> complete_chat, {loop_calls} in one workflow", loop_s))
    print(_row("temporal: a whole 1-call workflow (start..result)", single_s))
    print(f"1-call workflow / direct (start + result round trips included): {med_s / med_d:.3f}")
    ok = ratio <= TARGET_RATIO
    print(f"ratio LLM call through the activity / direct (medians): {ratio:.3f}  "
          f"target <= {TARGET_RATIO}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds (default 8)")
    parser.add_argument("--loop-calls", type=int, default=5, help="sequential calls per agent-loop workflow (default 5)")
    parser.add_argument("--latency-ms", type=int, default=200, help="simulated model latency (default 200)")
    parser.add_argument("--real-rounds", type=int, default=6, help="rounds against the real llama.cpp server (default 6)")
    parser.add_argument("--no-real", action="store_true", help="skip the real llama.cpp server row")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        ok = asyncio.run(main_async(args.rounds, args.loop_calls, args.latency_ms, Path(tmp),
                                    real_rounds=0 if args.no_real else args.real_rounds))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
