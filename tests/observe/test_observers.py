"""Issue 8: lifecycle events, Hooks (observers, middlewares, post-processor), MetricsObserver.

Hooks are driven directly here, as the engine will drive them. Threads run on
real clocks and synchronise on events; the timeout tests run on asyncio and on
Trio's virtual clock, where the exact time is asserted.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_batch_llm import (
    ArtifactIdentity,
    ConfigurationError,
    ErrorCategory,
    FakeStrategy,
    ProcessorConfig,
    ProviderError,
    RateLimitConfig,
    ResumePolicy,
    RetryConfig,
    process_prompts,
)
from trio_batch_llm._artifacts import JsonlArtifactStore
from trio_batch_llm._observe._events import (
    AttemptFailed,
    BatchFinished,
    BatchStarted,
    ItemCompleted,
    ItemFailed,
    ItemReplayed,
    ItemStarted,
    terminal_event,
)
from trio_batch_llm._observe._hooks import Hooks, Middleware
from trio_batch_llm._observe._metrics import MetricsObserver, _escape
from trio_batch_llm._values._requests import LLMWorkItem
from trio_batch_llm._values._results import BatchTermination, ItemTiming, WorkItemResult
from trio_batch_llm._values._stats import CounterSnapshot

from ..conftest import trio_virtual_clock

pytestmark = pytest.mark.anyio

FAKE = FakeStrategy()
COUNTS = CounterSnapshot(accepted=0, finished=0, succeeded=0, failed=0, replayed=0, input_tokens=0,
                         output_tokens=0, total_tokens=0, cost=0.0)


def item(item_id: str = "a", prompt: str = "p") -> LLMWorkItem[str]:
    return LLMWorkItem(item_id=item_id, strategy=FAKE, prompt=prompt)


def ok(item_id: str = "a", output: str = "out", **kw: Any) -> WorkItemResult[str]:
    return WorkItemResult(item_id=item_id, success=True, output=output, attempts=kw.pop("attempts", 1), **kw)


def failed(item_id: str, category: ErrorCategory, attempts: int, **kw: Any) -> WorkItemResult[str]:
    return WorkItemResult(item_id=item_id, success=False, error="x", error_category=category,
                          attempts=attempts, **kw)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_event(self, event: Any) -> None:
        self.events.append(event)


# --- building and emitting ---------------------------------------------------------


def test_nothing_registered_is_inactive() -> None:
    hooks = Hooks.build()
    assert not hooks.active and not hooks.observing
    stats = hooks.statistics()
    assert (stats.observers, stats.middlewares, stats.post_processor) == (0, 0, False)
    assert Hooks.build(observers=[print]).active
    assert Hooks.build(middlewares=[Middleware()]).active
    assert Hooks.build(post_processor=lambda r: r).active


def test_build_rejects_what_cannot_be_called() -> None:
    with pytest.raises(TypeError, match=r"observers\[1\]=42"):
        Hooks.build(observers=[print, 42])
    with pytest.raises(TypeError, match=r"middlewares\[0\]"):
        Hooks.build(middlewares=[object()])
    with pytest.raises(TypeError, match="post_processor="):
        Hooks.build(post_processor="nope")  # type: ignore[arg-type]
    for bad in (0, -1.0, math.nan, math.inf, "5", True):
        with pytest.raises(ConfigurationError, match="post_processor_timeout"):
            Hooks.build(post_processor=print, post_processor_timeout=bad)  # type: ignore[arg-type]
    assert Hooks.build(post_processor=print, post_processor_timeout=None).active


def test_terminal_event_per_outcome() -> None:
    assert isinstance(terminal_event(ok()), ItemCompleted)
    assert isinstance(terminal_event(failed("a", ErrorCategory.SERVER, 3)), ItemFailed)
    assert isinstance(terminal_event(dataclasses.replace(ok(), replayed=True)), ItemReplayed)
    replayed_failure = dataclasses.replace(failed("a", ErrorCategory.INVALID_REQUEST, 1), replayed=True)
    assert isinstance(terminal_event(replayed_failure), ItemReplayed)


def test_emit_reaches_every_observer_and_a_failing_one_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[Any] = []

    def broken(event: Any) -> None:
        calls.append(event)
        raise RuntimeError("observer bug")

    recorder = Recorder()
    hooks = Hooks.build(observers=[broken, recorder])
    events = [BatchStarted(3), ItemStarted("a"), ItemCompleted(ok())]
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.observers"):
        for event in events:
            hooks.emit(event)
        hooks.emit_terminal(failed("b", ErrorCategory.SERVER, 2))
    assert calls == [*events, ItemFailed(failed("b", ErrorCategory.SERVER, 2))]
    assert recorder.events == calls
    assert [r.getMessage() for r in caplog.records] == [
        "observer test_emit_reaches_every_observer_and_a_failing_one_is_logged_once.<locals>.broken "
        "raised; further failures of it are not logged"
    ]
    assert hooks.statistics().observer_errors == 4


def test_emit_does_not_swallow_base_exceptions() -> None:
    def interrupt(event: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Hooks.build(observers=[interrupt]).emit(BatchStarted(None))


# --- middlewares ---------------------------------------------------------------------


class Tagging(Middleware):
    """Sync middleware: tags the prompt, records its calls."""

    def __init__(self, tag: str, log: list[str]) -> None:
        self.tag = tag
        self.log = log

    def before(self, item: LLMWorkItem[Any]) -> LLMWorkItem[Any]:
        self.log.append(f"before:{self.tag}")
        return dataclasses.replace(item, prompt=f"{item.prompt}+{self.tag}")

    def after(self, item: LLMWorkItem[Any], result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        self.log.append(f"after:{self.tag}:{item.prompt}")
        return dataclasses.replace(result, output=f"{result.output}+{self.tag}")


class AsyncObserving:
    """Async middleware that changes nothing (returns None) and records errors."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def before(self, item: LLMWorkItem[Any]) -> None:
        await anyio.lowlevel.checkpoint()
        self.log.append(f"before:observing:{item.prompt}")

    async def on_error(self, item: LLMWorkItem[Any], exc: Exception, attempt: int) -> None:
        await anyio.lowlevel.checkpoint()
        self.log.append(f"on_error:{item.item_id}:{exc}:{attempt}")


async def test_middlewares_wrap_in_order_and_may_rewrite() -> None:
    log: list[str] = []
    post_seen: list[Any] = []

    async def post(result: WorkItemResult[Any]) -> None:
        await anyio.lowlevel.checkpoint()
        post_seen.append(result.output)
        log.append("post")

    hooks = Hooks.build(middlewares=[Tagging("one", log), AsyncObserving(log), Tagging("two", log)],
                        post_processor=post)
    original = item(prompt="p")
    rewritten = await hooks.before_item(original)
    assert rewritten.prompt == "p+one+two" and rewritten.item_id == "a"
    assert original.prompt == "p"  # replaced, not mutated
    result = await hooks.after_item(rewritten, ok(output="out"))
    assert result.output == "out+two+one"
    assert post_seen == ["out+two+one"]
    assert log == [
        "before:one", "before:observing:p+one", "before:two",
        "after:two:p+one+two", "after:one:p+one+two", "post",
    ]


async def test_a_middleware_may_not_change_the_item_id_or_return_junk() -> None:
    class Renaming(Middleware):
        def before(self, item: LLMWorkItem[Any]) -> LLMWorkItem[Any]:
            return dataclasses.replace(item, item_id="other")

    class Junk(Middleware):
        def after(self, item: LLMWorkItem[Any], result: WorkItemResult[Any]) -> int:
            return 3

    with pytest.raises(ValueError, match="changed item_id 'a' to 'other'"):
        await Hooks.build(middlewares=[Renaming()]).before_item(item())
    with pytest.raises(TypeError, match="returned 3, not a WorkItemResult"):
        await Hooks.build(middlewares=[Junk()]).after_item(item(), ok())


async def test_middleware_errors_in_before_propagate() -> None:
    class Broken(Middleware):
        async def before(self, item: LLMWorkItem[Any]) -> None:
            await anyio.lowlevel.checkpoint()
            raise LookupError("bug in before")

    with pytest.raises(LookupError, match="bug in before"):
        await Hooks.build(middlewares=[Broken()]).before_item(item())


async def test_on_attempt_error_emits_and_notifies(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []

    class Failing(Middleware):
        def on_error(self, item: LLMWorkItem[Any], exc: Exception, attempt: int) -> None:
            raise RuntimeError("on_error bug")

    recorder = Recorder()
    hooks = Hooks.build(observers=[recorder], middlewares=[Failing(), AsyncObserving(log)])
    with caplog.at_level(logging.WARNING, logger="trio_batch_llm.observers"):
        await hooks.on_attempt_error(item(), ValueError("boom"), 1, ErrorCategory.SERVER)
        await hooks.on_attempt_error(item(), ValueError("again"), 2, ErrorCategory.RATE_LIMIT)
    assert recorder.events == [AttemptFailed("a", 1, ErrorCategory.SERVER),
                               AttemptFailed("a", 2, ErrorCategory.RATE_LIMIT)]
    assert log == ["on_error:a:boom:1", "on_error:a:again:2"]
    assert len(caplog.records) == 1 and "on_error" in caplog.records[0].getMessage()


@pytest.mark.parametrize("call", ["before_item", "after_item", "on_attempt_error", "aclose"])
async def test_hooks_checkpoint_on_the_fast_path(call: str) -> None:
    hooks = Hooks.build(observers=[Recorder()])
    args: dict[str, tuple[Any, ...]] = {
        "before_item": (item(),), "after_item": (item(), ok()),
        "on_attempt_error": (item(), ValueError("x"), 1, ErrorCategory.SERVER), "aclose": (),
    }
    with anyio.CancelScope() as scope:
        scope.cancel()
        await getattr(hooks, call)(*args[call])
        pytest.fail(f"{call}() did not checkpoint")
    assert scope.cancelled_caught


# --- the post-processor -----------------------------------------------------------


async def test_async_post_processor_replaces_keeps_or_fails() -> None:
    async def post(result: WorkItemResult[Any]) -> WorkItemResult[Any] | None:
        await anyio.lowlevel.checkpoint()
        if result.output == "keep":
            return None
        if result.output == "boom":
            raise ValueError("cannot parse")
        if result.output == "junk":
            return "junk"  # type: ignore[return-value]
        if result.output == "other":
            return ok("zzz")
        return dataclasses.replace(result, output={"parsed": result.output})

    hooks = Hooks.build(post_processor=post)
    assert (await hooks.after_item(item(), ok(output="x"))).output == {"parsed": "x"}
    kept = ok(output="keep")
    assert await hooks.after_item(item(), kept) is kept
    boom = await hooks.after_item(item(), ok(output="boom"))
    assert (boom.success, boom.error_category, boom.output) == (False, ErrorCategory.PARSE, "boom")
    assert boom.error is not None and "raised ValueError: cannot parse" in boom.error
    assert isinstance(boom.exception, ValueError)
    junk = await hooks.after_item(item(), ok(output="junk"))
    assert junk.error_category is ErrorCategory.PARSE and "returned str" in (junk.error or "")
    other = await hooks.after_item(item(), ok(output="other"))
    assert other.item_id == "a" and "returned the result of 'zzz'" in (other.error or "")
    assert hooks.statistics().post_processor_failures == 3


async def test_post_processor_skips_failures_and_replays() -> None:
    seen: list[str] = []

    def post(result: WorkItemResult[Any]) -> None:
        seen.append(result.item_id)

    hooks = Hooks.build(post_processor=post)
    failure = failed("f", ErrorCategory.SERVER, 3)
    assert await hooks.after_item(item("f"), failure) is failure
    replay = dataclasses.replace(ok("r"), replayed=True)
    assert await hooks.after_item(item("r"), replay) is replay
    await hooks.after_item(item("s"), ok("s"))
    assert seen == ["s"]


async def test_sync_post_processor_runs_in_a_worker_thread() -> None:
    threads: list[int] = []

    def post(result: WorkItemResult[Any]) -> WorkItemResult[Any]:
        threads.append(threading.get_ident())
        return dataclasses.replace(result, output=str(result.output).upper())

    hooks = Hooks.build(post_processor=post)
    results = [await hooks.after_item(item(str(n)), ok(str(n), output=f"o{n}")) for n in range(3)]
    assert [r.output for r in results] == ["O0", "O1", "O2"]
    assert len(threads) == 3 and threading.get_ident() not in threads
    await hooks.aclose()
    assert not hooks.statistics().post_processor_thread_busy


class TestTimeouts:
    """Real threads on asyncio; Trio's virtual clock for exact times."""

    @pytest.fixture(scope="class", params=[pytest.param("asyncio", id="asyncio"),
                                           pytest.param(trio_virtual_clock(), id="trio-virtual")])
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        return request.param

    @staticmethod
    def timeout_for(backend: Any) -> float:
        # Virtual: exact. Real (asyncio): long enough for a worker thread to start.
        return 30.0 if backend != "asyncio" else 0.25

    async def test_async_post_processor_timeout_fails_the_item(self, anyio_backend: Any) -> None:
        timeout = self.timeout_for(anyio_backend)

        async def hangs(result: WorkItemResult[Any]) -> None:
            await anyio.sleep_forever()

        hooks = Hooks.build(post_processor=hangs, post_processor_timeout=timeout)
        started = anyio.current_time()
        result = await hooks.after_item(item(), ok(output="raw"))
        elapsed = anyio.current_time() - started
        assert (result.success, result.error_category, result.output) == (False, ErrorCategory.PARSE, "raw")
        assert isinstance(result.exception, TimeoutError)
        assert result.error == ("post-processor TestTimeouts.test_async_post_processor_timeout_fails_the_item"
                                f".<locals>.hangs timed out after {timeout:g} s")
        if anyio_backend != "asyncio":
            assert elapsed == timeout
        else:
            assert elapsed >= timeout
        assert hooks.statistics().post_processor_timeouts == 1

    async def test_sync_post_processor_thread_is_owned_after_a_timeout(self, anyio_backend: Any) -> None:
        timeout = self.timeout_for(anyio_backend)
        gate = threading.Event()
        ran: list[str] = []

        def blocks(result: WorkItemResult[Any]) -> None:
            ran.append(result.item_id)
            if result.item_id == "first":
                gate.wait()

        hooks = Hooks.build(post_processor=blocks, post_processor_timeout=timeout)
        outcomes: dict[str, WorkItemResult[Any]] = {}

        async def post_process(item_id: str) -> None:
            outcomes[item_id] = await hooks.after_item(item(item_id), ok(item_id))

        async with anyio.create_task_group() as group:
            group.start_soon(post_process, "first")
            # Keep the loop busy until the thread runs, so virtual time cannot jump past the
            # timeout before the thread has started.
            while not ran:
                await anyio.lowlevel.checkpoint()
        first = outcomes["first"]
        assert first.error_category is ErrorCategory.PARSE and "timed out" in (first.error or "")
        assert hooks.statistics().post_processor_thread_busy  # abandoned by its caller, still running
        # The next call waits for that thread (one at a time) and times out waiting: it never runs.
        await post_process("second")
        assert outcomes["second"].error_category is ErrorCategory.PARSE
        assert ran == ["first"]
        closed = anyio.Event()

        async def close() -> None:
            await hooks.aclose()  # waits for the abandoned thread to report back
            closed.set()

        async with anyio.create_task_group() as group:
            group.start_soon(close)
            for _ in range(10):
                await anyio.lowlevel.checkpoint()
            assert not closed.is_set()
            gate.set()
        assert not hooks.statistics().post_processor_thread_busy
        stats = hooks.statistics()
        assert (stats.post_processor_timeouts, stats.post_processor_failures) == (2, 0)
        async with anyio.create_task_group() as group:
            group.start_soon(post_process, "third")  # the gate is open again
            while "third" not in outcomes:  # busy, so virtual time stands still while the thread runs
                await anyio.lowlevel.checkpoint()
        assert outcomes["third"].success and ran == ["first", "third"]


# --- metrics --------------------------------------------------------------------------


def timed(result: WorkItemResult[Any], admission: float, execution: float,
          total: float) -> WorkItemResult[Any]:
    result.timing = ItemTiming(admission_wait=admission, execution=execution, total=total)
    return result


def scripted_metrics() -> MetricsObserver:
    metrics = MetricsObserver()
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    for event in [
        BatchStarted(4),
        ItemStarted("a"),
        AttemptFailed("a", 1, ErrorCategory.RATE_LIMIT),
        AttemptFailed("a", 2, ErrorCategory.SERVER),
        ItemStarted("b"),
        AttemptFailed("b", 1, ErrorCategory.TIMEOUT),
        AttemptFailed("b", 2, ErrorCategory.TIMEOUT),
        ItemCompleted(timed(ok("a", attempts=3, token_usage=dict(usage)), 0.003, 0.2, 1.5)),
        ItemFailed(timed(failed("b", ErrorCategory.TIMEOUT, 2, token_usage={"input_tokens": 7,
                                                                              "total_tokens": 7}),
                         0.0, 7.0, 7.0)),
        ItemReplayed(dataclasses.replace(ok("c", token_usage=dict(usage)), replayed=True)),
        ItemFailed(failed("d", ErrorCategory.NOT_EXECUTED, 0)),
        ItemStarted("e"),
        BatchFinished(BatchTermination("interrupted", "by SIGINT"), COUNTS),
    ]:
        metrics.on_event(event)
    return metrics


def test_metrics_counts_and_histograms() -> None:
    data = scripted_metrics().to_dict()
    assert data["items"] == {"succeeded": 1, "failed": 2, "replayed": 1}
    assert data["items_failed_by_category"] == {"not_executed": 1, "timeout": 1}
    assert data["in_flight"] == 1  # "e" started and has no result yet
    assert data["attempts"] == 5
    assert data["attempt_failures_by_category"] == {"rate_limit": 1, "server": 1, "timeout": 2}
    # b's second timeout ended the item: it was not retried.
    assert (data["retries"], data["retries_by_category"]) == (3, {"rate_limit": 1, "server": 1, "timeout": 1})
    assert data["tokens"] == {"input": 17, "output": 5, "total": 22}  # the replay cost nothing now
    assert data["batches"] == {"started": 1, "finished_by_termination": {"interrupted": 1}}
    admission = data["latency_seconds"]["admission_wait"]
    assert (admission["count"], admission["sum"]) == (2, 0.003)  # "d" never ran: not observed
    assert admission["buckets"]["0.005"] == 2 and admission["buckets"]["+Inf"] == 2
    execution = data["latency_seconds"]["execution"]["buckets"]
    assert (execution["0.1"], execution["0.25"], execution["5.0"], execution["10.0"]) == (0, 1, 1, 2)
    assert list(execution)[-1] == "+Inf" and execution["+Inf"] == 2


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')


def check_exposition(text: str) -> dict[str, list[tuple[str, str, float]]]:
    """A strict reader of the text format: every sample belongs to the family declared just before it."""
    assert text.endswith("\n") and not text.endswith("\n\n")
    families: dict[str, list[tuple[str, str, float]]] = {}
    kinds: dict[str, str] = {}
    current: str | None = None
    lines = text[:-1].split("\n")
    for index, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in families, f"family {name} declared twice"
            assert lines[index + 1].startswith(f"# TYPE {name} "), line
            families[name], current = [], name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name == current and kind in {"counter", "gauge", "histogram"}
            kinds[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            assert current is not None
            sample, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
            allowed = ({f"{current}_bucket", f"{current}_sum", f"{current}_count"}
                       if kinds[current] == "histogram" else {current})
            assert sample in allowed, (sample, current)
            families[current].append((sample, labels, value))
    for name, samples in families.items():
        if kinds[name] != "histogram":
            continue
        buckets = [(labels, value) for sample, labels, value in samples if sample.endswith("_bucket")]
        bounds = [float(labels.split('"')[1].replace("+Inf", "inf")) for labels, _ in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf, name
        counts = [value for _, value in buckets]
        assert counts == sorted(counts), f"{name}: buckets not cumulative"
        (count,) = [value for sample, _, value in samples if sample == f"{name}_count"]
        assert counts[-1] == count
    return families


def test_prometheus_exposition_is_well_formed() -> None:
    text = scripted_metrics().to_prometheus()
    families = check_exposition(text)
    assert 'trio_batch_llm_items_total{outcome="succeeded"} 1\n' in text
    assert 'trio_batch_llm_retries_total{category="timeout"} 1\n' in text
    assert "trio_batch_llm_items_in_flight 1\n" in text
    assert 'trio_batch_llm_execution_seconds_bucket{le="0.25"} 1\n' in text
    assert 'trio_batch_llm_execution_seconds_bucket{le="+Inf"} 2\n' in text
    assert "trio_batch_llm_execution_seconds_sum 7.2\n" in text
    assert "trio_batch_llm_execution_seconds_count 2\n" in text
    assert "# TYPE trio_batch_llm_item_duration_seconds histogram\n" in text
    assert set(families) >= {"trio_batch_llm_items_total", "trio_batch_llm_tokens_total",
                             "trio_batch_llm_admission_wait_seconds"}
    empty = MetricsObserver(prefix="llm", buckets=[1, 0.5])
    families = check_exposition(empty.to_prometheus())
    assert families["llm_items_failed_total"] == []  # declared, no samples yet
    labels = [s[1] for s in families["llm_execution_seconds"][:3]]
    assert labels == ['{le="0.5"}', '{le="1.0"}', '{le="+Inf"}']


def test_label_escaping_and_bucket_validation() -> None:
    assert _escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    for bad in ([], [0.1, 0.1], [-1.0], [math.inf], [math.nan]):
        with pytest.raises(ConfigurationError, match="buckets"):
            MetricsObserver(buckets=bad)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.booleans(), st.sampled_from(list(ErrorCategory)[:6])),
                min_size=1, max_size=20))
def test_metrics_retries_add_up(items: list[tuple[int, bool, ErrorCategory]]) -> None:
    """Every attempt but the last of an item is a retry, whatever the outcome."""
    metrics = MetricsObserver()
    for index, (attempts, success, category) in enumerate(items):
        item_id = f"i{index}"
        metrics.on_event(ItemStarted(item_id))
        failures = attempts - 1 if success else attempts
        for attempt in range(1, failures + 1):
            metrics.on_event(AttemptFailed(item_id, attempt, category))
        result = ok(item_id, attempts=attempts) if success else failed(item_id, category, attempts)
        metrics.on_event(terminal_event(result))
    assert metrics.retries_total == sum(attempts - 1 for attempts, _, _ in items)
    assert metrics.in_flight == 0
    assert metrics.items["succeeded"] + metrics.items["failed"] == len(items)
    assert all(h.count == len(items) for h in metrics.histograms.values())
    check_exposition(metrics.to_prometheus())


# --- end to end through the engine ------------------------------------------------------



async def test_exactly_one_terminal_event_per_item_under_failures_and_replays(tmp_path: Path) -> None:
    identity = ArtifactIdentity(provider="fake", model="fake-model")
    path = tmp_path / "run.jsonl"
    prompts = [(f"id{n}", f"p{n}") for n in range(12)]
    script: dict[str, list[Any]] = {
        "p1": [ProviderError("flaky", category=ErrorCategory.SERVER)],  # retried, then succeeds
        "p2": [ProviderError("bad", category=ErrorCategory.INVALID_REQUEST)],  # fails for good
        "p3": [ProviderError("slow down", category=ErrorCategory.RATE_LIMIT, retry_after=0.0)],
    }
    retry = RetryConfig(max_attempts=3, initial_wait=0.0, max_wait=0.0)
    config = ProcessorConfig(concurrency=4, retry=retry,
                             rate_limit=RateLimitConfig(cooldown_seconds=0.0, slow_start_seconds=0.0))
    await process_prompts(FakeStrategy(script=script), prompts[:6], config=config,
                          artifact_store=JsonlArtifactStore(path, identity=identity))
    recorder, metrics = Recorder(), MetricsObserver()
    rerun_script = {"p2": script["p2"] * 3, "p7": [ProviderError("x", category=ErrorCategory.PARSE)] * 3}
    batch = await process_prompts(
        FakeStrategy(script=rerun_script),
        prompts, config=config, artifact_store=JsonlArtifactStore(path, identity=identity),
        resume=ResumePolicy.REUSE_SUCCESSES, observers=[recorder, metrics],
    )
    terminals: dict[str, list[Any]] = {}
    for event in recorder.events:
        if isinstance(event, ItemCompleted | ItemFailed | ItemReplayed):
            terminals.setdefault(event.result.item_id, []).append(type(event).__name__)
    assert terminals == {
        **{f"id{n}": ["ItemReplayed"] for n in (0, 1, 3, 4, 5)},
        "id2": ["ItemFailed"], "id7": ["ItemFailed"],
        **{f"id{n}": ["ItemCompleted"] for n in (6, 8, 9, 10, 11)},
    }
    assert isinstance(recorder.events[0], BatchStarted) and isinstance(recorder.events[-1], BatchFinished)
    assert sum(isinstance(e, BatchStarted | BatchFinished) for e in recorder.events) == 2
    started = [e.item_id for e in recorder.events if isinstance(e, ItemStarted)]
    assert sorted(started) == sorted(["id2", "id6", "id7", "id8", "id9", "id10", "id11"])
    assert metrics.items == {"succeeded": 5, "failed": 2, "replayed": 5}
    assert metrics.retries == {"parse": 2}  # p2's one failure ended it; p7's last one too
    assert batch.total_items == 12
