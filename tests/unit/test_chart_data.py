"""The in-kernel extension that describes figures and tables as data (`kg_chart_data.py`),
on real matplotlib figures and pandas frames (Agg, in this process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
pd = pytest.importorskip("pandas")

import matplotlib.pyplot as plt  # noqa: E402

from kernel_gateway.in_kernel import kg_chart_data as charts  # noqa: E402


@pytest.fixture
def ax() -> Iterator[Any]:
    figure, axes = plt.subplots()
    yield axes
    plt.close(figure)


def described(ax: Any) -> dict[str, Any]:
    ax.figure.canvas.draw()  # tick labels are known once drawn (the PNG is made first)
    found = charts.figure_chart(ax.figure)
    assert found is not None
    return found


def test_a_line_with_its_axes_units_and_points(ax: Any) -> None:
    ax.plot([1, 2, 3], [2, 4, 8], label="growth")
    ax.set_title("Growth")
    ax.set_xlabel("Time (s)")
    ax.set_ylabel("Size [MB]")
    chart = described(ax)
    assert chart["type"] == "line" and chart["title"] == "Growth"
    assert (chart["x_unit"], chart["y_unit"], chart["x_scale"]) == ("s", "MB", "linear")
    assert chart["elements"] == [
        {"label": "growth", "points": [[1.0, 2.0], [2.0, 4.0], [3.0, 8.0]]}
    ]
    assert len(chart["x_ticks"]) == len(chart["x_tick_labels"]) > 0


def test_bars_pies_boxes_and_scatters(ax: Any) -> None:
    ax.bar(["a", "b"], [3, 5], label="sold")
    assert described(ax)["elements"] == [
        {"label": "a", "group": "sold", "value": 3.0},
        {"label": "b", "group": "sold", "value": 5.0},
    ]
    ax.clear()
    ax.pie([1, 3], labels=["x", "y"])
    assert [(e["label"], e["angle"]) for e in described(ax)["elements"]] == [
        ("x", 90.0),
        ("y", 270.0),
    ]
    ax.clear()
    ax.boxplot([[1, 2, 3, 4, 5, 20]], patch_artist=True, tick_labels=["A"])
    box = described(ax)["elements"][0]
    assert box["label"] == "A" and box["median"] == 3.5 and box["outliers"] == [20.0]
    assert box["min"] <= box["first_quartile"] <= box["third_quartile"] <= box["max"]
    ax.clear()
    ax.scatter([1, 2], [3, 4], label="s")
    assert described(ax)["type"] == "scatter"


def test_several_axes_are_a_superchart_and_dates_stay_dates() -> None:
    figure, (left, right) = plt.subplots(1, 2)
    left.plot(pd.date_range("2024-01-01", periods=2), [1, 2])
    right.bar([1], [2])
    figure.suptitle("Two")
    figure.canvas.draw()
    chart = charts.figure_chart(figure)
    plt.close(figure)
    assert chart is not None and chart["type"] == "superchart" and chart["title"] == "Two"
    line, bar = chart["elements"]
    assert line["x_scale"] == "datetime" and line["elements"][0]["points"][0][0].startswith(
        "2024-01-01"
    )
    assert bar["type"] == "bar"


def test_what_cannot_be_described_is_left_out(ax: Any) -> None:
    ax.plot(range(charts.MAX_POINTS + 1))
    assert charts.figure_chart(ax.figure) is None  # too many points: the picture alone
    assert charts.figure_chart(plt.figure()) is None
    plt.close("all")
    assert charts.quietly(lambda obj: 1 / 0)(object()) is None


def test_a_tables_columns_as_json() -> None:
    frame = pd.DataFrame(
        {"n": [1, None], "when": pd.to_datetime(["2024-01-01", "2024-01-02"]), "s": ["x", "y"]}
    )
    data = charts.frame_data(frame)
    assert data is not None
    assert data["n"] == [1.0, None] and data["s"] == ["x", "y"]
    assert data["when"][0].startswith("2024-01-01")
    big = pd.DataFrame({"a": range(charts.MAX_CELLS + 1)})
    assert charts.frame_data(big) is None
