"""A cell's life on a fake backend: timeouts, interrupts, deaths, restarts, disconnects.

The fake kernels speak the real Jupyter protocol (tests/fake_kernel.py), so
everything above the backend runs as in production, in milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway.errors import KernelUnavailable, SessionBusy, SessionFailed
from kernel_gateway.kernels.backends.base import SessionStorage
from kernel_gateway.kernels.events import OutputLimiter
from kernel_gateway.sessions.execution import Execution, State, StopReason
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.restart_policy import RestartPolicy
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.principal import ADMIN
from kernel_gateway.types import Event
from tests.support.fake_kernel import FakeBackend, FakeKernelProcess, fake_registry, run, until


@dataclass
class Harness:
    registry: Registry
    backend: FakeBackend

    async def session(self) -> Session:
        return await self.registry.create_session(owner=ADMIN)

    def pool_full(self) -> bool:
        stats = self.registry.warm.stats()
        return bool(stats["warm"] == stats["target"] and stats["starting"] == 0)

    def process_of(self, session: Session) -> FakeKernelProcess:
        kernel = session.slot.kernel
        assert kernel is not None
        process = kernel.process
        assert isinstance(process, FakeKernelProcess)
        return process


async def empty_slot(gw: Harness, session: Session) -> None:
    """Kill the session's kernel with every launch failing, so its revival leaves the slot
    empty; then launches work again (the warm pool's refills cannot take the failure)."""
    gw.backend.fail_launches = 10_000
    await run(session, "die")
    await until(lambda: session.slot.kernel is None and not session.slot.lock.locked())
    await asyncio.sleep(0.05)
    gw.backend.fail_launches = 0


def done_of(events: list[Any]) -> dict[str, Any]:
    names = [name for name, _ in events]
    assert names.count("done") == 1 and names[-1] == "done", names
    data: dict[str, Any] = events[-1][1]
    return data


def errors_of(events: list[Any]) -> list[str]:
    return [data["ename"] for name, data in events if name == "error"]


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Harness]:
    async with fake_registry(
        tmp_path,
        interrupt_grace=0.2,
        restart_budget=2,
        restart_window=60,
        max_queued_executions=3,
    ) as (registry, backend):
        yield Harness(registry, backend)


# -- the verdict, computed in one place -------------------------------------------------------


def execution() -> Execution:
    return Execution("x", 1.0, OutputLimiter(1000, 1000))


def test_a_stop_request_is_overtaken_by_what_actually_ended_the_cell() -> None:
    ex = execution()
    assert ex.stop(StopReason.INTERRUPT)
    assert not ex.stop(StopReason.DISCONNECT)  # same rank: the first stays
    assert ex.stop(StopReason.DEATH, "out_of_memory")
    assert not ex.stop(StopReason.TIMEOUT)  # lower rank
    assert ex.status == "died" and ex.done_data()["reason"] == "out_of_memory"
    assert ex.stop(StopReason.CLOSED)
    # mypy keeps `ex.status` narrowed to "died" by the assert above; stop() has changed it.
    assert ex.status == "interrupted"  # type: ignore[comparison-overlap]


def test_done_is_emitted_once_and_nothing_after_it() -> None:
    ex = execution()
    ex.start()
    ex.finish()
    ex.finish()
    ex.emit(Event("stdout", {"text": "late"}))
    assert ex.state is State.DONE
    assert [r.event.name for r in ex._log] == ["done"]
    assert not ex.stop(StopReason.TIMEOUT)


# -- the restart policy -----------------------------------------------------------------------


def test_restart_policy_backs_off_then_fails_and_forgets_old_deaths() -> None:
    now = [0.0]
    policy = RestartPolicy(budget=3, window=10, clock=lambda: now[0])
    delays = []
    for _ in range(3):
        assert policy.record_death("s")
        delays.append(policy.backoff())
    assert delays == [0.0, 0.5, 1.0]
    assert not policy.record_death("s")
    assert policy.failed and "4 times within 10 s" in policy.failed
    policy.reset()
    assert policy.failed is None and policy.backoff() == 0.0
    assert policy.record_death("s")
    now[0] = 11.0  # the earlier death left the window
    assert policy.record_death("s") and policy.backoff() == 0.0


# -- cells ------------------------------------------------------------------------------------


async def test_output_and_state_of_a_plain_cell(gw: Harness) -> None:
    session = await gw.session()
    events = await run(session, "print hello\nstderr oops")
    assert events[:2] == [("stdout", {"text": "hello\n"}), ("stderr", {"text": "oops\n"})]
    done = done_of(events)
    assert (done["status"], done["execution_count"], done["restarted"]) == ("ok", 1, False)
    assert session.execution_count == 1 and session.status == "idle"


async def test_an_error_ends_error(gw: Harness) -> None:
    session = await gw.session()
    events = await run(session, "error")
    assert errors_of(events) == ["ValueError"] and done_of(events)["status"] == "error"


async def test_code_around_a_cell_runs_silently_in_its_turn(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("print cell", None, ("print before", "print after"))
    events = [(e.name, e.data) for e in [e async for e in execution.stream()]]
    assert [d for n, d in events if n == "stdout"] == [{"text": "cell\n"}]
    assert done_of(events)["execution_count"] == 1
    assert gw.process_of(session).executed == ["print before", "print cell", "print after"]


async def test_code_after_a_timed_out_cell_still_runs(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("sleep 30", 0.05, ("print before", "print after"))
    events = [(e.name, e.data) for e in [e async for e in execution.stream()]]
    assert done_of(events)["status"] == "timeout"
    assert gw.process_of(session).executed[-1] == "print after"


async def test_code_after_a_dead_kernels_cell_is_not_run(gw: Harness) -> None:
    session = await gw.session()
    process = gw.process_of(session)
    execution = session.submit("die", None, ("print before", "print after"))
    events = [(e.name, e.data) for e in [e async for e in execution.stream()]]
    assert done_of(events)["status"] == "died"
    assert process.executed == ["print before", "die"]


async def test_timeout_interrupts_and_keeps_the_kernel(gw: Harness) -> None:
    session = await gw.session()
    kernel = session.slot.kernel
    events = await run(session, "sleep 30", limit=0.05)
    done = done_of(events)
    assert (done["status"], done["restarted"]) == ("timeout", False)
    assert gw.process_of(session).interrupts >= 1
    assert session.slot.kernel is kernel
    assert done_of(await run(session, "print next"))["restarted"] is False


async def test_timeout_then_kill_when_interrupts_are_ignored(gw: Harness) -> None:
    session = await gw.session()
    kernel = session.slot.kernel
    events = await run(session, "hang", limit=0.05)
    done = done_of(events)
    assert (done["status"], done["restarted"]) == ("timeout", True)
    assert "TimeoutError" in errors_of(events)
    after = await run(session, "print alive")
    assert done_of(after)["status"] == "ok"
    assert done_of(after)["restarted"] is False  # the timed-out cell already said so
    assert session.slot.kernel is not kernel
    assert session.slot.policy.failed is None  # a kill on purpose is not a death


async def test_user_interrupt(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("sleep 30", None)
    await until(lambda: execution.running)
    assert await session.interrupt()
    events = [e async for e in execution.stream()]
    assert events[-1].data["status"] == "interrupted"
    assert not await session.interrupt()  # nothing runs now


async def test_an_interrupt_the_kernel_answers_silently_still_says_so(gw: Harness) -> None:
    # ipykernel catches a SIGINT that lands outside the cell's code (before it runs) and
    # sends neither an error nor a reply: the client must still learn why the cell ended.
    session = await gw.session()
    execution = session.submit("outside 30", None)
    # Sent is not yet begun: a SIGINT before the kernel reaches `outside` is the cell's.
    await until(lambda: execution.running and any(k.outside for k in gw.backend.kernels))
    assert await session.interrupt()
    events = [e async for e in execution.stream()]
    assert events[-1].data["status"] == "interrupted"
    errors = [e.data for e in events if e.name == "error"]
    assert [e["ename"] for e in errors] == ["KeyboardInterrupt"]
    assert "before" in errors[0]["evalue"]
    after = await run(session, "print alive")
    assert done_of(after)["status"] == "ok"


async def test_a_timeout_the_kernel_answers_silently_still_says_so(gw: Harness) -> None:
    session = await gw.session()
    events = await run(session, "outside 30", 0.3)
    assert done_of(events)["status"] == "timeout"
    assert [data["ename"] for name, data in events if name == "error"] == ["KeyboardInterrupt"]


async def test_death_is_reported_and_the_next_cell_is_told(gw: Harness) -> None:
    session = await gw.session()
    events = await run(session, "print before\ndie 3")
    done = done_of(events)
    assert (done["status"], done["reason"], done["restarted"]) == ("died", "exited", False)
    assert "KernelDied" in errors_of(events)
    after = await run(session, "print after")
    assert ("stdout", {"text": "after\n"}) in after
    assert done_of(after)["restarted"] is True


async def test_out_of_memory_is_named(gw: Harness) -> None:
    session = await gw.session()
    assert done_of(await run(session, "oom"))["reason"] == "out_of_memory"


async def test_death_while_idle_is_revived_in_the_background(gw: Harness) -> None:
    session = await gw.session()
    first = session.slot.kernel
    await gw.process_of(session).kill()
    for _ in range(200):
        if session.slot.kernel is not first and session.slot.alive:
            break
        await asyncio.sleep(0.01)
    assert session.slot.kernel is not first and session.slot.alive
    assert done_of(await run(session, "print x"))["restarted"] is True


async def test_restart_budget_fails_the_session_until_an_explicit_restart(gw: Harness) -> None:
    session = await gw.session()
    for _ in range(2):  # the budget is 2 deaths
        assert done_of(await run(session, "die"))["status"] == "died"
    events = await run(session, "die")
    done = done_of(events)
    assert done["session_failed"] is True and "SessionFailed" in errors_of(events)
    assert session.status == "failed"
    with pytest.raises(SessionFailed):
        session.submit("print no", None)
    await session.restart()
    # mypy keeps `session.status` narrowed to "failed" by the assert above; restart() changed it.
    assert session.status == "idle"  # type: ignore[comparison-overlap]
    assert done_of(await run(session, "print yes"))["status"] == "ok"


async def test_cells_queued_behind_a_death_that_fails_the_session_do_not_revive(
    gw: Harness,
) -> None:
    session = await gw.session()
    await run(session, "die")
    await run(session, "die")
    last = session.submit("die", None)
    queued = session.submit("print never", None)
    await last.task  # type: ignore[misc]
    events = [(e.name, e.data) async for e in queued.stream()]
    assert done_of(events)["reason"] == "session_failed"
    assert not any("never" in str(data) for _, data in events)


async def test_restart_drops_queued_cells_and_stops_a_stuck_one(gw: Harness) -> None:
    session = await gw.session()
    stuck = session.submit("hang", None)
    queued = session.submit("print queued", None)
    await until(lambda: stuck.running)
    await session.restart()
    stuck_events = [e async for e in stuck.stream()]
    queued_events = [e async for e in queued.stream()]
    assert stuck_events[-1].data["status"] == "interrupted"
    assert stuck_events[-1].data["restarted"] is True
    assert queued_events[-1].data["status"] == "interrupted"
    assert all(e.name != "stdout" for e in queued_events)
    after = await run(session, "print fresh")
    assert done_of(after) | {"duration_ms": 0} == {
        "status": "ok",
        "execution_count": 1,
        "duration_ms": 0,
        "restarted": False,  # asked for: not a surprise
    }


async def test_queue_limit(gw: Harness) -> None:
    session = await gw.session()
    cells = [session.submit("sleep 0.2", None) for _ in range(3)]
    with pytest.raises(SessionBusy):
        session.submit("print x", None)
    for cell in cells:
        await cell.task  # type: ignore[misc]


async def test_closing_a_session_ends_running_and_queued_cells(gw: Harness) -> None:
    session = await gw.session()
    running = session.submit("hang", None)
    queued = session.submit("print x", None)
    await until(lambda: running.running)
    await gw.registry.delete_session(session.id, ADMIN)
    for execution in (running, queued):
        events = [e async for e in execution.stream()]
        assert events[-1].data["status"] == "interrupted"
        assert "SessionClosed" in [e.data.get("ename") for e in events]


# -- disconnects ------------------------------------------------------------------------------


async def test_an_abandoned_cell_is_interrupted(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("sleep 30", None)
    await until(lambda: execution.running)
    session.abandon(execution)
    await execution.task  # type: ignore[misc]
    assert execution.status == "interrupted"
    assert done_of(await run(session, "print x"))["restarted"] is False


async def test_an_abandoned_cell_that_ignores_interrupts_costs_its_kernel(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("hang", None)
    await until(lambda: execution.running)
    session.abandon(execution)
    await execution.task  # type: ignore[misc]
    assert execution.status == "interrupted" and execution.restarted
    after = await run(session, "print x")
    assert done_of(after)["restarted"] is True  # nobody saw the abandoned cell's `done`
    assert session.slot.policy.failed is None


async def test_a_queued_cell_abandoned_never_runs(gw: Harness) -> None:
    session = await gw.session()
    first = session.submit("sleep 0.1", None)
    second = session.submit("print never", None)
    session.abandon(second)
    await first.task  # type: ignore[misc]
    await second.task  # type: ignore[misc]
    assert second.status == "interrupted"
    assert all("never" not in code for code in gw.process_of(session).executed)


# -- launch failures (defect 5) ---------------------------------------------------------------


async def test_restart_with_failing_launches_raises_kernel_unavailable(gw: Harness) -> None:
    session = await gw.session()
    gw.backend.fail_launches = 1
    with pytest.raises(KernelUnavailable):
        await session.restart()
    assert session.status == "restarting"
    assert done_of(await run(session, "print back"))["status"] == "ok"


async def test_a_cell_whose_kernel_cannot_start_ends_died_and_the_session_recovers(
    gw: Harness,
) -> None:
    session = await gw.session()
    gw.backend.fail_launches = 100
    events = await run(session, "die")
    assert done_of(events)["status"] == "died"
    for _ in range(50):  # let the background revival fail
        await asyncio.sleep(0.01)
    events = await run(session, "print x")
    assert done_of(events)["reason"] == "start_failed"
    assert "KernelUnavailable" in errors_of(events)
    gw.backend.fail_launches = 0
    after = await run(session, "print x")
    assert done_of(after)["status"] == "ok" and done_of(after)["restarted"] is True


# -- malformed messages (defect 4) ------------------------------------------------------------


async def test_a_malformed_message_is_dropped_and_counted_not_fatal(gw: Harness) -> None:
    session = await gw.session()
    events = await run(session, "malformed\ngarbage\nprint still here", limit=5)
    assert ("stdout", {"text": "still here\n"}) in events
    assert done_of(events)["status"] == "ok"
    kernel = session.slot.kernel
    assert kernel is not None and kernel.dropped_messages == 2
    assert done_of(await run(session, "print next"))["status"] == "ok"


# -- stateless cleanup (defect 8) -------------------------------------------------------------


async def test_a_stateless_kernel_is_released_when_its_cell_ends_even_unread(
    gw: Harness,
) -> None:
    session, execution = await gw.registry.run_stateless("print x", None, [], owner=ADMIN)
    assert gw.registry.stats()["stateless"] == 1
    await execution.task  # type: ignore[misc]
    for _ in range(100):
        if gw.registry.stats()["stateless"] == 0 and session.slot.closed:
            break
        await asyncio.sleep(0.01)
    assert gw.registry.stats()["stateless"] == 0 and session.slot.closed


async def test_a_stateless_response_torn_down_before_its_first_step_abandons_the_cell(
    gw: Harness,
) -> None:
    from starlette.requests import Request

    from kernel_gateway.server.routes.streaming import respond

    session, execution = await gw.registry.run_stateless("sleep 30", None, [], owner=ADMIN)
    scope = {"type": "http", "method": "POST", "path": "/execute", "headers": []}
    response = await respond(Request(scope), session, execution)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(message: Any) -> None:
        return None

    task = asyncio.ensure_future(response(scope, receive, send))
    await asyncio.sleep(0)
    task.cancel()  # torn down before the body generator ever ran
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(asyncio.shield(execution.task), 5)  # type: ignore[arg-type]
    assert execution.stop_reason is StopReason.DISCONNECT
    for _ in range(100):
        if gw.registry.stats()["stateless"] == 0:
            break
        await asyncio.sleep(0.01)
    assert gw.registry.stats()["stateless"] == 0


# -- review of the state rewrite: regressions and races ---------------------------------------


async def test_a_disconnect_after_an_ignored_interrupt_still_costs_the_kernel(
    gw: Harness,
) -> None:
    # The user's interrupt is a stop request of the same rank as a disconnect: the
    # disconnect must still lead to the kill, not leave the cell running until its timeout.
    session = await gw.session()
    kernel = session.slot.kernel
    execution = session.submit("hang", 30)
    await until(lambda: execution.running)
    assert await session.interrupt()
    session.abandon(execution)
    await asyncio.wait_for(asyncio.shield(execution.task), 3)  # type: ignore[arg-type]
    assert execution.status == "interrupted" and execution.restarted
    assert done_of(await run(session, "print x"))["status"] == "ok"
    assert session.slot.kernel is not kernel


async def test_a_restart_while_a_finished_cell_reports_its_files_leaves_it_ok(
    gw: Harness,
) -> None:
    session = await gw.session()
    gate = asyncio.Event()
    report = session.files.changed_file_events

    async def slow_report() -> list[Event]:
        await gate.wait()
        return await report()

    session.files.changed_file_events = slow_report  # type: ignore[method-assign]
    execution = session.submit("print hi", None)
    await until(lambda: execution.state is State.FINISHING)
    restart = asyncio.ensure_future(session.restart())
    await asyncio.sleep(0.02)
    gate.set()
    await restart
    events = [(e.name, e.data) async for e in execution.stream()]
    assert done_of(events)["status"] == "ok"  # it ran to its end before the restart


async def test_a_cell_abandoned_while_its_kernel_starts_is_never_sent(gw: Harness) -> None:
    session = await gw.session()
    await empty_slot(gw, session)
    gw.backend.launch_delay = 0.3  # the cell's own revival is still starting below
    execution = session.submit("print never", None)
    await until(lambda: session.current is execution)
    session.abandon(execution)
    await execution.task  # type: ignore[misc]
    assert execution.status == "interrupted"
    assert all("never" not in code for k in gw.backend.kernels for code in k.executed)
    assert done_of(await run(session, "print x"))["restarted"] is True  # the notice is kept


async def test_a_session_deleted_while_a_cell_starts_its_kernel_says_so(gw: Harness) -> None:
    session = await gw.session()
    await empty_slot(gw, session)
    gw.backend.launch_delay = 0.3  # the cell's own revival is still starting below
    execution = session.submit("print never", None)
    await until(lambda: session.current is execution)
    await gw.registry.delete_session(session.id, ADMIN)
    events = [(e.name, e.data) async for e in execution.stream()]
    assert errors_of(events) == ["SessionClosed"]  # not a GatewayError
    assert done_of(events)["status"] == "interrupted"


async def test_closing_the_registry_waits_for_stateless_releases_that_start_meanwhile(
    gw: Harness,
) -> None:
    delays: dict[Path, float] = {}
    removed: list[Path] = []
    remove = gw.registry.warm.remove_storage

    async def slow_remove(storage: SessionStorage) -> None:
        await asyncio.sleep(delays.get(storage.root, 0.0))
        await remove(storage)
        removed.append(storage.root)

    # Patched first: the first cell may end (and be released) while the second one starts.
    gw.registry.warm.remove_storage = slow_remove  # type: ignore[method-assign]
    first, done_first = await gw.registry.run_stateless("print a", None, [], owner=ADMIN)
    second, done_second = await gw.registry.run_stateless("sleep 0.05", None, [], owner=ADMIN)
    delays.update({first.slot.storage.root: 0.2, second.slot.storage.root: 0.4})
    await done_first.task  # type: ignore[misc]
    await asyncio.sleep(0)  # the first release is under way; the second cell still runs
    await gw.registry.close()  # the second cell ends, and is released, while it waits
    assert done_second.finished and second.slot.closed
    assert set(removed) >= set(delays)


async def test_deleting_a_session_does_not_wait_out_a_restart_backoff(gw: Harness) -> None:
    session = await gw.session()
    await run(session, "die")
    await run(session, "die")  # the next revival backs off 0.5 s
    await gw.process_of(session).kill()
    await until(lambda: session.slot.kernel is not None and not session.slot.alive)
    await asyncio.sleep(0.05)  # the background revival is now sleeping its backoff
    started = asyncio.get_running_loop().time()
    await gw.registry.delete_session(session.id, ADMIN)
    assert asyncio.get_running_loop().time() - started < 0.4


async def test_no_waiter_outlives_a_cell_whose_kernel_was_killed(gw: Harness) -> None:
    session = await gw.session()
    await until(gw.pool_full)  # the refill's kernel tasks are counted in both figures
    before = len(asyncio.all_tasks())
    events = await run(session, "hang", limit=0.05)
    assert done_of(events)["restarted"] is True
    await asyncio.sleep(0.05)
    await until(gw.pool_full)

    def waiters() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "Event.wait" in repr(t)]

    # A leaked waiter stays forever; a kernel still starting (the session's replacement,
    # on a loaded machine) holds one for a moment only.
    try:
        await until(lambda: not waiters(), seconds=5)
    except AssertionError:
        raise AssertionError(waiters()) from None
    assert len(asyncio.all_tasks()) <= before + 2


# -- resumable streams ------------------------------------------------------------------------


async def ids_and_names(execution: Execution, after: int | None = None) -> list[tuple[int, str]]:
    return [(r.id, r.event.name) async for r in execution.records(after)]


async def test_event_ids_increase_across_a_sessions_executions(gw: Harness) -> None:
    session = await gw.session()
    first = session.submit("print a\nprint b", None)
    second = session.submit("print c", None)
    one, two = await ids_and_names(first), await ids_and_names(second)
    ids = [i for i, _ in one + two]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert (first.id, second.id) == ("1", "2")


async def test_a_reader_resumes_after_any_event_id_live_or_ended(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("print 1\nsleep 0.1\nprint 2\nprint 3", None)
    live = ids_and_names(execution)
    first_two = []
    async for record in execution.records():
        first_two.append((record.id, record.event.name))
        if len(first_two) == 1:
            break  # a cut mid-stream, while the cell still runs
    rest = await ids_and_names(execution, after=first_two[-1][0])
    assert first_two + rest == await live
    assert [n for _, n in rest][-1] == "done"
    for cut in range(len(rest) + 1):  # and from every point once it has ended
        whole = first_two + rest
        assert await ids_and_names(execution, after=whole[cut][0]) == whole[cut + 1 :]


async def test_retention_keeps_the_last_executions_and_says_410_for_older(gw: Harness) -> None:
    from kernel_gateway.errors import ExecutionExpired, ExecutionNotFound

    session = await gw.session()
    executions = [session.submit(f"print {i}", None) for i in range(3)]
    session.attach(executions[0])  # a client is reading execution 1
    for execution in executions:
        await execution.task  # type: ignore[misc]
    session.log._settings = replace_settings(session, replay_executions=1)
    session.log.keep_recent()
    assert [e.id for e in session.executions()] == ["1", "3"]  # "1" is being read: kept
    session.detach(executions[0])  # its reader is done
    assert [e.id for e in session.executions()] == ["3"]
    with pytest.raises(ExecutionExpired):
        session.execution("2")
    with pytest.raises(ExecutionExpired):
        [r async for r in executions[1].records()]
    with pytest.raises(ExecutionNotFound):
        session.execution("4")
    with pytest.raises(ExecutionNotFound):
        session.execution("x")


async def test_retention_is_capped_in_bytes(gw: Harness) -> None:
    session = await gw.session()
    session.log._settings = replace_settings(session, replay_bytes=200)
    for i in range(5):
        await session.submit(f"print {'x' * 100}{i}", None).task  # type: ignore[misc]
    kept = session.executions()
    assert sum(e.bytes for e in kept) <= 200 or len(kept) == 1
    assert kept[-1].id == "5"


async def test_a_detached_cell_runs_on_through_the_grace_when_resumed(gw: Harness) -> None:
    session = await gw.session()
    session.log._settings = replace_settings(session, reconnect_grace=0.3)
    execution = session.submit("sleep 0.5\nprint done", None)
    session.attach(execution)
    await until(lambda: execution.running)
    session.detach(execution)  # the connection dropped
    await asyncio.sleep(0.1)
    session.attach(execution)  # ... and came back within the grace
    await execution.task  # type: ignore[misc]
    assert execution.status == "ok" and execution.stop_reason is None


async def test_a_detached_cell_nobody_resumes_is_interrupted_after_the_grace(gw: Harness) -> None:
    session = await gw.session()
    session.log._settings = replace_settings(session, reconnect_grace=0.2)
    execution = session.submit("sleep 30", None)
    session.attach(execution)
    await until(lambda: execution.running)
    session.detach(execution)
    await asyncio.sleep(0.1)
    assert execution.stop_reason is None  # still within the grace
    await asyncio.wait_for(asyncio.shield(execution.task), 3)  # type: ignore[arg-type]
    assert execution.status == "interrupted"
    assert execution.stop_reason is StopReason.DISCONNECT


def replace_settings(session: Session, **changes: Any) -> Settings:
    import dataclasses

    return dataclasses.replace(session._settings, **changes)


async def test_deleting_a_session_does_not_wait_out_a_reconnect_grace(gw: Harness) -> None:
    session = await gw.session()
    execution = session.submit("sleep 30", None)
    session.attach(execution)
    await until(lambda: execution.running)
    session.detach(execution)  # the default grace is 10 s
    started = asyncio.get_running_loop().time()
    await gw.registry.delete_session(session.id, ADMIN)
    assert asyncio.get_running_loop().time() - started < 2
