"""Property tests: no bulkhead permit is ever leaked or over-granted, whatever the interleaving.

Random mixes of successes, exceptions, KeyboardInterrupt and cancellations (while waiting, while
holding, right after a slot was handed over) from tasks and threads; plus a model-based state machine
checking FIFO hand-off exactly against a reference queue.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from django_ratelimit_r4.core.bulkhead import Bulkhead, BulkheadConfig
from django_ratelimit_r4.core.exceptions import BulkheadFull
from tests.core.test_bulkhead import InFlight as Peak

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WAITS = st.sampled_from([0, "1ms", "3ms", "50ms"])
OUTCOMES = st.sampled_from(["ok", "raise", "interrupt"])




def assert_no_leak(b: Bulkhead, peak: Peak, max_calls: int) -> None:
    assert peak.peak <= max_calls
    assert peak.now == 0
    assert b.metrics.concurrent_calls == 0
    assert b.metrics.waiting_calls == 0
    assert b.metrics.available_concurrent_calls == max_calls


task_spec = st.tuples(
    st.integers(0, 3),  # ms before the call starts
    st.integers(0, 4),  # ms holding the permit
    OUTCOMES,
    st.none() | st.integers(0, 8),  # cancel the task after this many ms (waiting, holding, or done)
    st.sampled_from(["async with", "acall", "try+on_complete"]),
)


async def _run_tasks(
    b: Bulkhead, peak: Peak, specs: list[tuple[int, int, str, int | None, str]]
) -> list[str]:
    """Run one task per spec on the current loop; returns what each task observed."""
    observed: list[str] = []

    async def body(hold_ms: int, outcome: str) -> None:
        peak.enter()
        try:
            await asyncio.sleep(hold_ms / 1000)
            if outcome == "raise":
                raise ValueError("call failed")
            if outcome == "interrupt":
                raise KeyboardInterrupt  # a BaseException through the async path
        finally:
            peak.exit()

    async def one(start_ms: int, hold_ms: int, outcome: str, style: str) -> None:
        await asyncio.sleep(start_ms / 1000)
        observed.append("started")
        try:
            if style == "async with":
                async with b:
                    await body(hold_ms, outcome)
            elif style == "acall":
                await b.acall(body, hold_ms, outcome)
            else:
                if not await b.atry_acquire_permission():
                    raise BulkheadFull(b)
                try:
                    await body(hold_ms, outcome)
                finally:
                    b.on_complete()
            observed.append("ok")
        except BulkheadFull:
            observed.append("full")
        except (ValueError, KeyboardInterrupt):
            observed.append("raised")

    loop = asyncio.get_running_loop()
    tasks = []
    for start_ms, hold_ms, outcome, cancel_ms, style in specs:
        task = asyncio.ensure_future(one(start_ms, hold_ms, outcome, style))
        if cancel_ms is not None:
            loop.call_later(cancel_ms / 1000, task.cancel)
        tasks.append(task)
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.01)  # let late cancel timers fire on finished tasks (no effect expected)
    return observed


@SETTINGS
@given(max_calls=st.integers(1, 4), wait=WAITS, specs=st.lists(task_spec, min_size=1, max_size=15))
def test_tasks_never_leak_a_permit(
    max_calls: int, wait: object, specs: list[tuple[int, int, str, int | None, str]]
) -> None:
    b = Bulkhead("p", BulkheadConfig(max_concurrent_calls=max_calls, max_wait_duration=wait))
    peak = Peak()
    observed = asyncio.run(_run_tasks(b, peak, specs))
    assert_no_leak(b, peak, max_calls)
    m = b.metrics
    # Every call that started was either permitted or rejected (a cancelled wait counts as rejected),
    # and every permitted call finished.
    assert m.permitted_calls + m.rejected_calls == observed.count("started")
    assert m.finished_calls == m.permitted_calls
    assert observed.count("full") <= m.rejected_calls


thread_spec = st.tuples(
    st.integers(0, 2),  # ms before the call
    st.integers(0, 3),  # ms holding
    OUTCOMES,
    st.sampled_from(["with", "call", "try+on_complete", "try+release_permission"]),
)


def _thread_call(b: Bulkhead, peak: Peak, start_ms: int, hold_ms: int, outcome: str, style: str) -> None:
    def body() -> None:
        peak.enter()
        try:
            time.sleep(hold_ms / 1000)
            if outcome == "raise":
                raise ValueError("call failed")
            if outcome == "interrupt":
                raise KeyboardInterrupt
        finally:
            peak.exit()

    time.sleep(start_ms / 1000)
    try:
        if style == "with":
            with b:
                body()
        elif style == "call":
            b.call(body)
        elif b.try_acquire_permission():
            try:
                body()
            finally:
                if style == "try+on_complete":
                    b.on_complete()
                else:
                    b.release_permission()
    except (BulkheadFull, ValueError, KeyboardInterrupt):
        pass


@SETTINGS
@given(max_calls=st.integers(1, 3), wait=WAITS, specs=st.lists(thread_spec, min_size=2, max_size=8))
def test_threads_never_leak_a_permit(
    max_calls: int, wait: object, specs: list[tuple[int, int, str, str]]
) -> None:
    b = Bulkhead("p", BulkheadConfig(max_concurrent_calls=max_calls, max_wait_duration=wait))
    peak = Peak()
    barrier = threading.Barrier(len(specs))

    def run(spec: tuple[int, int, str, str]) -> None:
        barrier.wait()
        _thread_call(b, peak, *spec)

    threads = [threading.Thread(target=run, args=(spec,)) for spec in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert_no_leak(b, peak, max_calls)
    assert b.metrics.permitted_calls + b.metrics.rejected_calls == len(specs)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_calls=st.integers(1, 3),
    wait=st.sampled_from(["2ms", "50ms"]),
    thread_specs=st.lists(thread_spec, min_size=1, max_size=5),
    task_specs=st.lists(task_spec, min_size=1, max_size=8),
)
def test_threads_and_tasks_on_one_instance_never_leak_a_permit(
    max_calls: int,
    wait: object,
    thread_specs: list[tuple[int, int, str, str]],
    task_specs: list[tuple[int, int, str, int | None, str]],
) -> None:
    b = Bulkhead("p", BulkheadConfig(max_concurrent_calls=max_calls, max_wait_duration=wait))
    peak = Peak()
    threads = [threading.Thread(target=_thread_call, args=(b, peak, *spec)) for spec in thread_specs]
    for t in threads:
        t.start()
    asyncio.run(_run_tasks(b, peak, task_specs))
    for t in threads:
        t.join()
    assert_no_leak(b, peak, max_calls)


class FifoHandOff(RuleBasedStateMachine):
    """Tasks on one loop against a reference model: a FIFO queue and a set of holders.

    The loop is run to quiescence after every rule, so the real bulkhead and the model must agree
    exactly on who holds a slot, who waits, and the order in which slots were granted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.max = 2
        self.b = Bulkhead("fifo", BulkheadConfig(max_concurrent_calls=self.max, max_wait_duration="1h"))
        self.next_id = 0
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.leave: dict[int, asyncio.Event] = {}
        self.granted: list[int] = []  # real grant order
        # the model
        self.queue: deque[int] = deque()
        self.holders: set[int] = set()
        self.model_granted: list[int] = []
        self.released_by_test: set[int] = set()
        self.rejected: list[int] = []
        self.model_rejected: list[int] = []

    def teardown(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self._settle()
        self.loop.close()

    def _settle(self) -> None:
        for _ in range(5):
            self.loop.run_until_complete(asyncio.sleep(0))

    def _model_fill(self) -> None:
        while self.queue and len(self.holders) < self.max:
            i = self.queue.popleft()
            self.holders.add(i)
            self.model_granted.append(i)

    async def _call(self, i: int) -> None:
        try:
            await self.b.aacquire_permission()
        except BulkheadFull:
            self.rejected.append(i)
            return
        self.granted.append(i)
        try:
            await self.leave[i].wait()
        finally:
            if i not in self.released_by_test:
                self.b.on_complete()

    @rule()
    def arrive(self) -> None:
        i = self.next_id
        self.next_id += 1
        self.leave[i] = asyncio.Event()
        self.tasks[i] = self.loop.create_task(self._call(i))
        if self.max == 0:
            self.model_rejected.append(i)  # a bulkhead of 0 rejects at once, without queueing
        else:
            self.queue.append(i)  # join the queue, then take a free slot if any
            self._model_fill()
        self._settle()

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.holders)))
        self.leave[i].set()
        self.holders.discard(i)
        self._model_fill()
        self._settle()

    @precondition(lambda self: self.holders or self.queue)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.holders | set(self.queue))))
        self.tasks[i].cancel()
        if i in self.holders:
            self.holders.discard(i)
        else:
            self.queue.remove(i)
        self._model_fill()
        self._settle()

    @precondition(lambda self: self.holders and self.queue)
    @rule(data=st.data())
    def finish_then_cancel_the_heir(self, data: st.DataObject) -> None:
        # on_complete() hands the slot to the queue head at once; the head is cancelled before it runs.
        i = data.draw(st.sampled_from(sorted(self.holders)))
        heir = self.queue[0]
        self.released_by_test.add(i)
        self.b.on_complete()  # the holder's release, done here so nothing runs in between
        self.tasks[heir].cancel()
        self.leave[i].set()
        self.holders.discard(i)
        self._model_fill()
        if heir in self.holders:  # it was handed the slot: the cancel must pass it on
            self.holders.discard(heir)
            self.model_granted.remove(heir)
        else:
            self.queue.remove(heir)
        self._model_fill()
        self._settle()

    @rule(new_max=st.integers(0, 4))
    def change_limit(self, new_max: int) -> None:
        self.max = new_max
        self.b.change_config(BulkheadConfig(max_concurrent_calls=new_max, max_wait_duration="1h"))
        self._model_fill()
        self._settle()

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.granted == self.model_granted
        assert self.rejected == self.model_rejected
        assert self.b.metrics.waiting_calls == len(self.queue)
        assert self.b.metrics.concurrent_calls == len(self.holders)
        assert self.b.metrics.available_concurrent_calls == max(0, self.max - len(self.holders))


FifoHandOff.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_fifo_hand_off_matches_the_model = FifoHandOff.TestCase
