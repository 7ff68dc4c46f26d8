"""The two-worker scheduler (`tests/support/scheduling.py`): units longest first, and each
test sent as its index in the worker's own collection."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.support import scheduling

COLLECTION = [
    "tests/integration/test_a.py::test_one",
    "tests/integration/test_a.py::test_two",
    "tests/integration/test_a.py::test_three",
    "tests/integration/test_api.py::test_one[local]",
    "tests/integration/test_api.py::test_two[local]",
    "tests/integration/test_api.py::test_one[gvisor]",
    "tests/integration/cluster/test_x.py::test_one",
    "tests/integration/cluster/test_y.py::test_one",
    "tests/unit/test_b.py::test_one",
]


class Worker:
    """What the scheduler asks of an xdist worker: take tests by index, shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(list(indices))

    def send_runtest_all(self) -> None:
        raise AssertionError("a file scheduler sends units")

    def shutdown(self) -> None:
        self.shutting_down = True


class Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def scheduled(workers: int) -> list[Worker]:
    config = SimpleNamespace(
        option=SimpleNamespace(loadscopereorder=True, maxschedchunk=None),
        getvalue=lambda name: {"tx": [f"{workers}*popen"]}.get(name),
    )
    scheduler = scheduling.make_scheduler(config, Log())  # type: ignore[arg-type]
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, COLLECTION)
    scheduler.schedule()
    done: set[tuple[str, int]] = set()
    while True:  # workers finish what they were sent, and are sent more
        pending = [
            (node, i)
            for node in nodes
            for batch in node.sent
            for i in batch
            if (node.gateway.id, i) not in done
        ]
        if not pending:
            return nodes
        node, i = pending[0]
        done.add((node.gateway.id, i))
        scheduler.mark_test_complete(node, i)


def test_every_index_names_the_test_of_its_unit_in_the_workers_own_collection() -> None:
    nodes = scheduled(2)
    sent = [COLLECTION[i] for node in nodes for batch in node.sent for i in batch]
    assert sorted(sent) == sorted(COLLECTION)  # each test once
    for node in nodes:
        for batch in node.sent:
            units = {scheduling.unit_of(COLLECTION[i]) for i in batch}
            assert len(units) == 1, units  # a batch is one unit
            assert batch == sorted(batch)  # in collection order


def test_the_longest_units_go_first_and_the_swarm_suites_are_one() -> None:
    (node,) = scheduled(1)
    order = [scheduling.unit_of(COLLECTION[batch[0]]) for batch in node.sent]
    assert order == [
        "tests/integration/cluster",
        "tests/integration/test_api.py",
        "tests/integration/test_a.py",
        "tests/unit/test_b.py",
    ]
