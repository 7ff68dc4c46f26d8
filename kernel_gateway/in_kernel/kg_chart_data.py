"""What a figure and a table hold, as data beside their pictures: an IPython extension.

Loaded in every Python kernel (`kernel_startup._config`), it adds two display formats:

- `application/vnd.e2b.chart+json` for a matplotlib `Figure`: its chart as E2B's code
  interpreter describes one (its SDK's `Result.chart`): `type` line, scatter, bar, pie,
  box_and_whisker, superchart (a figure of several axes) or unknown; `title`; for 2-D
  charts the axis labels, units (`"Time (s)"` -> `s`), ticks, tick labels and scales; and
  `elements`: each line's or scatter's points, each bar's label, group and value, each
  wedge's label, angle and radius, each box's five numbers and outliers.
- `application/vnd.e2b.data+json` for a pandas `DataFrame`: its columns as JSON
  (`{"column": [values...]}`, NaN as null, times as ISO strings), for tables of at most
  MAX_CELLS cells.

Both are skipped, never an error, for what they cannot describe (a chart of more than
MAX_POINTS points, an object the extraction fails on): the figure's picture still goes.
Imports nothing but the standard library until it describes an object.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

CHART_MIME = "application/vnd.e2b.chart+json"
DATA_MIME = "application/vnd.e2b.data+json"
"""JSON MIME types (E2B's own server names them `e2b/chart` and `e2b/data`, which a
notebook cannot hold: nbformat takes objects only under a `+json` type)."""
MAX_POINTS = 20_000
MAX_CELLS = 10_000
UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


class TooLarge(Exception):
    pass


def load_ipython_extension(shell: Any) -> None:
    parent = shell.display_formatter
    for mime, module, name, describe in (
        (CHART_MIME, "matplotlib.figure", "Figure", figure_chart),
        (DATA_MIME, "pandas", "DataFrame", frame_data),
    ):
        parent.formatters[mime] = _formatter(mime, module, name, quietly(describe))(parent=parent)


def _formatter(mime: str, module: str, name: str, describe: Any) -> Any:
    """A display formatter of `mime` for instances of `module.name`. It checks the object's
    type itself (the module is imported by the code, if ever): IPython's registrations by
    type name did not survive the shell's start-up."""
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode

    class Formatter(BaseFormatter):
        format_type = Unicode(mime)
        _return_type = (dict,)

        def __call__(self, obj: Any) -> dict[str, Any] | None:
            kind = getattr(sys.modules.get(module), name, None)
            if isinstance(kind, type) and isinstance(obj, kind):
                return describe(obj)  # type: ignore[no-any-return]
            return None

    return Formatter


def quietly(describe: Any) -> Any:
    """`describe`, returning None where it fails (a formatter that raises would print a
    traceback into the user's cell)."""

    def call(obj: Any) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] | None = describe(obj)
        except Exception:
            return None
        return found

    return call


# -- tables ------------------------------------------------------------------------------


def frame_data(frame: Any) -> dict[str, Any] | None:
    if frame.size > MAX_CELLS:
        return None
    columns: dict[str, Any] = json.loads(frame.to_json(orient="split", date_format="iso"))
    names = [str(name) for name in columns["columns"]]
    rows = columns["data"]
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


# -- charts ------------------------------------------------------------------------------


def figure_chart(figure: Any) -> dict[str, Any] | None:
    axes = [ax for ax in figure.get_axes() if ax.get_visible()]
    if not axes:
        return None
    budget = [MAX_POINTS]
    try:
        if len(axes) == 1:
            return axes_chart(axes[0], budget)
        title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
        return {
            "type": "superchart",
            "title": title or None,
            "elements": [axes_chart(ax, budget) for ax in axes],
        }
    except TooLarge:
        return None


def axes_chart(ax: Any, budget: list[int]) -> dict[str, Any]:
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    lines = list(ax.get_lines())
    patches = [p for p in ax.patches if p.get_visible()]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    others = [c for c in ax.collections if not isinstance(c, PathCollection)]
    base: dict[str, Any] = {"title": ax.get_title() or None}
    if patches and all(isinstance(p, Wedge) for p in patches) and not lines:
        return {**base, "type": "pie", "elements": _wedges(patches)}
    if patches and all(isinstance(p, PathPatch) for p in patches):
        return {**_planar(ax, base), "type": "box_and_whisker", "elements": _boxes(ax, patches)}
    if ax.containers and patches and all(isinstance(p, Rectangle) for p in patches):
        return {**_planar(ax, base), "type": "bar", "elements": _bars(ax)}
    if scatters and not lines and not patches and not others:
        elements = [_points(str(c.get_label()), c.get_offsets(), budget) for c in scatters]
        return {**_point_axes(ax, base), "type": "scatter", "elements": elements}
    if lines and not scatters and not patches and not others:
        elements = [_line_points(line, budget) for line in lines if isinstance(line, Line2D)]
        return {**_point_axes(ax, base), "type": "line", "elements": elements}
    return {**base, "type": "unknown", "elements": []}


def _line_points(line: Any, budget: list[int]) -> dict[str, Any]:
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    return _points(str(line.get_label()), zip(xs, ys, strict=False), budget)


def _planar(ax: Any, base: dict[str, Any]) -> dict[str, Any]:
    x_label, y_label = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {
        **base,
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
    }


def _unit(label: str | None) -> str | None:
    found = UNIT.search(label or "")
    return (found.group(1) or found.group(2)) if found else None


def _point_axes(ax: Any, base: dict[str, Any]) -> dict[str, Any]:
    out = _planar(ax, base)
    for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
        scale = axis.get_scale()
        getter = getattr(axis, "get_converter", None)
        converter = getter() if getter is not None else getattr(axis, "converter", None)
        if converter is not None and "date" in type(converter).__module__:
            scale = "datetime"
        elif converter is not None and "category" in type(converter).__module__:
            scale = "categorical"
        out[f"{name}_scale"] = scale
        out[f"{name}_ticks"] = [_value(t, scale) for t in axis.get_ticklocs()]
        out[f"{name}_tick_labels"] = [t.get_text() for t in axis.get_ticklabels()]
    return out


def _value(value: Any, scale: str = "linear") -> Any:
    if scale == "datetime":
        from matplotlib import dates

        to_date: Any = dates.num2date
        return str(to_date(float(value)).isoformat())
    if isinstance(value, str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if "datetime64" in type(value).__name__:  # numpy's: its ISO form
        return str(value)
    number = float(value)
    return number if math.isfinite(number) else None


def _points(label: str, pairs: Any, budget: list[int]) -> dict[str, Any]:
    points = []
    for x, y in pairs:
        budget[0] -= 1
        if budget[0] < 0:
            raise TooLarge()
        points.append([_value(x), _value(y)])
    return {"label": label, "points": points}


def _bars(ax: Any) -> list[dict[str, Any]]:
    elements = []
    for container in ax.containers:
        group = container.get_label()
        rects = list(container)
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        ticks = ax.get_yticklabels() if horizontal else ax.get_xticklabels()
        places = ax.get_yticks() if horizontal else ax.get_xticks()
        names = {round(float(p), 6): t.get_text() for p, t in zip(places, ticks, strict=False)}
        for rect in rects:
            middle = (
                rect.get_y() + rect.get_height() / 2
                if horizontal
                else (rect.get_x() + rect.get_width() / 2)
            )
            value = rect.get_width() if horizontal else rect.get_height()
            label = names.get(round(middle, 6), str(round(middle, 6)))
            elements.append({"label": label, "group": group, "value": _value(value)})
    return elements


def _wedges(patches: list[Any]) -> list[dict[str, Any]]:
    return [
        {"label": w.get_label(), "angle": abs(round(w.theta2 - w.theta1, 4)), "radius": w.r}
        for w in patches
    ]


def _boxes(ax: Any, patches: list[Any]) -> list[dict[str, Any]]:
    """Each box (a PathPatch) with the median and whiskers drawn over it, read back."""
    ticks = {
        round(float(p), 6): t.get_text()
        for p, t in zip(ax.get_xticks(), ax.get_xticklabels(), strict=False)
    }
    boxes = []
    for index, patch in enumerate(patches):
        vertices = patch.get_path().vertices
        xs, ys = vertices[:, 0], vertices[:, 1]
        left, right, low, high = float(min(xs)), float(max(xs)), float(min(ys)), float(max(ys))
        middle = round((left + right) / 2, 6)
        box: dict[str, Any] = {
            "label": ticks.get(middle) or patch.get_label() or str(index + 1),
            "min": low,
            "first_quartile": low,
            "median": (low + high) / 2,
            "third_quartile": high,
            "max": high,
            "outliers": [],
        }
        for line in ax.get_lines():
            x, y = [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]
            if not x or not all(left <= v <= right for v in x):
                continue
            if line.get_linestyle() in ("None", "", " ") and line.get_marker() not in ("", None):
                box["outliers"] += y  # fliers: markers only
            elif len(y) == 2 and y[0] == y[1] and low <= y[0] <= high and x[0] != x[1]:
                if (x[0], x[1]) == (left, right):
                    box["median"] = y[0]
            elif len(y) == 2 and x[0] == x[1]:  # a whisker, from the box outwards
                if max(y) <= low:
                    box["min"] = min(y)
                elif min(y) >= high:
                    box["max"] = max(y)
        boxes.append(box)
    return boxes
