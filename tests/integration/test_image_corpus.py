"""The kernel image runs the code models write today (issue 16), through the gateway.

Each program is a short script written against current APIs (numpy 2, pandas 2.2+,
scikit-learn, statsmodels, sympy, plotly, matplotlib 3.10+, file round trips) or with a
habit of generated code (`matplotlib.use("Agg")` then `plt.show()`, `sys.stdout.buffer`,
Chinese chart labels, `!pip install`). Each is checked on what it really produced: the
values it printed (worked out here independently, or checked inside against a second
computation), the charts and files it sent. A program that fails in any way (an
exception, no output, a missing chart) fails its test with the kernel's own error.

Programs that change the kernel's process-wide state (the matplotlib backend, rc
settings, `sys.stdout`) run as stateless executions in a kernel of their own; the rest
share one session, cell after cell, as a conversation would.

Run against another image with KG_TEST_IMAGE (the Docker tests' image).
"""

from __future__ import annotations

import base64
import json
import struct
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.backends import require_docker, settings_for
from tests.support.server import ServerThread

pytestmark = pytest.mark.docker
JSON = {"Content-Type": "application/json", "Accept": "application/json"}


@dataclass
class Run:
    """One program's collected result (the execute route's JSON document)."""

    status: str
    stdout: str
    stderr: str
    error: dict[str, Any] | None
    events: list[dict[str, Any]]
    seconds: float

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e["event"] == name]

    @property
    def pngs(self) -> list[bytes]:
        return [
            base64.b64decode(d["data"]["image/png"])
            for d in self.named("display")
            if "image/png" in d["data"]
        ]

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return {f["path"]: f for f in self.named("file")}

    def value(self) -> Any:
        """The JSON on the last stdout line starting with `RESULT `."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"no RESULT line in stdout: {self.stdout[-500:]!r}"
        return json.loads(lines[-1].removeprefix("RESULT "))


@dataclass
class Program:
    name: str
    code: str
    check: Callable[[Run], None] = field(default=lambda run: None)
    fresh: bool = False  # run in a kernel of its own (it changes process-wide state)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def result(expected: Any) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        assert run.value() == expected

    return check


def close(expected: list[float] | float, tol: float = 1e-6) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        got = run.value()
        want = expected if isinstance(expected, list) else [expected]
        got = got if isinstance(got, list) else [got]
        assert len(got) == len(want), got
        for g, w in zip(got, want, strict=True):
            assert abs(g - w) <= tol * max(1.0, abs(w)), (got, want)

    return check


def one_chart(min_width: int = 100) -> Callable[[Run], None]:
    def check(run: Run) -> None:
        assert len(run.pngs) == 1, [list(d["data"]) for d in run.named("display")]
        width, height = png_size(run.pngs[0])
        assert width >= min_width and height >= 100, (width, height)

    return check


def all_of(*checks: Callable[[Run], None]) -> Callable[[Run], None]:
    """One check that runs `checks` in order (the first failing one fails the program)."""

    def check(run: Run) -> None:
        for each in checks:
            each(run)

    return check


# Chinese labels: no "Glyph ... missing" warning while drawing, every character found in
# a font of the text's fallback list, and the title drawn differently from characters
# no font has (tofu boxes all look alike).
CJK_CHECK = """
import io, warnings
import numpy as np
from matplotlib.font_manager import fontManager, get_font
def _pixels(fig):
    buf = io.BytesIO(); fig.savefig(buf, format="png", dpi=50); buf.seek(0)
    return plt.imread(buf)
with warnings.catch_warnings():
    warnings.simplefilter("error")
    fig.canvas.draw()
    title = ax.title
    fonts = [get_font(p) for p in fontManager._find_fonts_by_props(title.get_fontproperties())]
    missing = [c for c in title.get_text() if not any(f.get_char_index(ord(c)) for f in fonts)]
    shown = _pixels(fig)
text = title.get_text()
title.set_text("\\ue000" * len(text))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    tofu = _pixels(fig)
title.set_text(text)
plt.show()
print("RESULT", json.dumps({"missing": missing, "differs": bool(np.abs(shown - tofu).sum() > 1)}))
"""


def cjk_check(run: Run) -> None:
    assert "missing from font" not in run.stderr, run.stderr
    assert "findfont" not in run.stderr, run.stderr
    assert run.value() == {"missing": [], "differs": True}
    one_chart()(run)


PROGRAMS = [
    # -- what is installed ------------------------------------------------------------------
    Program(
        "current_versions",
        """
        import json, sys
        from importlib.metadata import version
        names = ["numpy", "pandas", "scipy", "matplotlib", "seaborn", "pillow", "ipykernel",
                 "scikit-learn", "statsmodels", "sympy", "plotly", "pyarrow", "openpyxl",
                 "xlrd", "pyyaml", "networkx", "beautifulsoup4", "lxml", "tabulate"]
        major = lambda n: tuple(int(p) for p in version(n).split(".")[:2])
        print("RESULT", json.dumps({
            "python": sys.version_info[:2] >= (3, 11),
            "numpy2": major("numpy") >= (2, 0), "pandas2": major("pandas") >= (2, 2),
            "mpl": major("matplotlib") >= (3, 10), "all": all(version(n) for n in names)}))
        """,
        result({"python": True, "numpy2": True, "pandas2": True, "mpl": True, "all": True}),
    ),
    Program(
        "imports_models_reach_for",
        """
        import importlib, json
        mods = ["sklearn", "yaml", "statsmodels.api", "sympy", "plotly.express", "pyarrow",
                "openpyxl", "xlrd", "xlsxwriter", "networkx", "bs4", "lxml.etree", "tabulate",
                "seaborn", "scipy.stats", "PIL.Image", "jinja2", "requests", "tqdm", "joblib"]
        failed = []
        for m in mods:
            try:
                importlib.import_module(m)
            except Exception as exc:
                failed.append(f"{m}: {exc}")
        print("RESULT", json.dumps(failed))
        """,
        result([]),
    ),
    # -- numpy 2 -----------------------------------------------------------------------------
    Program(
        "numpy_trapezoid",
        "import numpy as np, json\nprint('RESULT', json.dumps(float(np.trapezoid([1, 2, 3]))))",
        close(4.0),
    ),
    Program(
        "numpy_cumulative_sum",
        "import numpy as np, json\n"
        "print('RESULT', json.dumps(np.cumulative_sum(np.arange(5)).tolist()))",
        result([0, 1, 3, 6, 10]),
    ),
    Program(
        "numpy_strings",
        "import numpy as np, json\n"
        "print('RESULT', json.dumps(np.strings.upper(np.array(['ab', 'c'])).tolist()))",
        result(["AB", "C"]),
    ),
    Program(
        "numpy_array_api",
        """
        import numpy as np, json
        v = np.unique_counts(np.array([3, 1, 1, 3, 3]))
        print("RESULT", json.dumps({
            "values": v.values.tolist(), "counts": v.counts.tolist(),
            "norm": float(np.linalg.vector_norm(np.array([3.0, 4.0]))),
            "vecdot": float(np.vecdot(np.array([1.0, 2.0]), np.array([3.0, 4.0]))),
            "isdtype": bool(np.isdtype(np.float32, "real floating")),
            "T": np.linalg.matrix_transpose(np.arange(6).reshape(2, 3)).shape}))
        """,
        result(
            {
                "values": [1, 3],
                "counts": [2, 3],
                "norm": 5.0,
                "vecdot": 11.0,
                "isdtype": True,
                "T": [3, 2],
            }
        ),
    ),
    Program(
        "numpy_copy_none_and_bool",
        """
        import numpy as np, json
        a = np.arange(3)
        b = np.asarray(a, copy=None)
        c = np.array(a, copy=True)
        print("RESULT", json.dumps([b is a, c is a, np.bool(1).item(), np.long(7).item()]))
        """,
        result([True, False, True, 7]),
    ),
    # -- pandas 2.2+ -------------------------------------------------------------------------
    Program(
        "pandas_dataframe_map",
        """
        import pandas as pd, json
        df = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
        print("RESULT", json.dumps(df.map(lambda v: v * 10).values.tolist()))
        """,
        result([[10, 30], [20, 40]]),
    ),
    Program(
        "pandas_month_end_alias",
        """
        import pandas as pd, json
        days = pd.date_range("2024-01-01", periods=3, freq="ME")
        hours = pd.date_range("2024-01-01", periods=2, freq="h")
        print("RESULT", json.dumps([str(d.date()) for d in days] + [str(hours[1])]))
        """,
        result(["2024-01-31", "2024-02-29", "2024-03-31", "2024-01-01 01:00:00"]),
    ),
    Program(
        "pandas_case_when",
        """
        import pandas as pd, json
        s = pd.Series([1, 5, 10])
        out = s.case_when([(s < 3, "low"), (s < 8, "mid")])
        print("RESULT", json.dumps(out.astype(str).tolist()))
        """,
        result(["low", "mid", "10"]),
    ),
    Program(
        "pandas_pyarrow_backend",
        """
        import io, json, pandas as pd
        df = pd.read_csv(io.StringIO("x,y\\n1,a\\n2,b\\n"), dtype_backend="pyarrow",
                         engine="pyarrow")
        print("RESULT", json.dumps([str(df.dtypes["x"]), str(df.dtypes["y"]),
                                    int(df["x"].sum())]))
        """,
        result(["int64[pyarrow]", "string[pyarrow]", 3]),
    ),
    Program(
        "pandas_named_aggregation",
        """
        import pandas as pd, json
        df = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
        out = df.groupby("k", as_index=False).agg(total=("v", "sum"), n=("v", "size"))
        print("RESULT", json.dumps(out.to_dict(orient="records")))
        """,
        result([{"k": "a", "total": 4, "n": 2}, {"k": "b", "total": 2, "n": 1}]),
    ),
    Program(
        "pandas_copy_on_write_option",
        """
        import pandas as pd, json
        pd.set_option("mode.copy_on_write", True)
        df = pd.DataFrame({"a": [1, 2]})
        sub = df["a"]
        sub.iloc[0] = 100
        print("RESULT", json.dumps(int(df["a"].iloc[0])))
        pd.set_option("mode.copy_on_write", False)
        """,
        result(1),
    ),
    Program(
        "pandas_to_markdown",
        """
        import pandas as pd
        print(pd.DataFrame({"name": ["x"], "n": [1]}).to_markdown(index=False))
        """,
        lambda run: _assert("| name   |   n |" in run.stdout, run.stdout),
    ),
    Program(
        "pandas_styler_html",
        """
        import pandas as pd, json
        html = pd.DataFrame({"v": [1.5, 2.5]}).style.format("{:.2f}").highlight_max().to_html()
        print("RESULT", json.dumps(["1.50" in html, "2.50" in html, "<table" in html]))
        """,
        result([True, True, True]),
    ),
    Program(
        "pandas_rich_display",
        "import pandas as pd\npd.DataFrame({'a': [1, 2]})",
        lambda run: _assert(
            "<table" in run.named("result")[0]["data"]["text/html"], run.named("result")
        ),
    ),
    Program(
        "pandas_sqlite_round_trip",
        """
        import sqlite3, json, pandas as pd
        con = sqlite3.connect(":memory:")
        pd.DataFrame({"a": [1, 2, 3]}).to_sql("t", con, index=False)
        print("RESULT", json.dumps(int(pd.read_sql("SELECT SUM(a) AS s FROM t", con)["s"][0])))
        """,
        result(6),
    ),
    # -- files -------------------------------------------------------------------------------
    Program(
        "excel_round_trip_openpyxl",
        """
        import pandas as pd, json
        df = pd.DataFrame({"name": ["a", "b"], "score": [1.5, 2.0]})
        df.to_excel("scores.xlsx", index=False)
        back = pd.read_excel("scores.xlsx")
        print("RESULT", json.dumps(back.equals(df)))
        """,
        all_of(
            result(True),
            lambda run: _assert(run.files["scores.xlsx"]["size"] > 1000, run.files),
        ),
    ),
    Program(
        "excel_xlsxwriter_engine",
        """
        import pandas as pd, json
        with pd.ExcelWriter("report.xlsx", engine="xlsxwriter") as writer:
            pd.DataFrame({"x": [1, 2, 3]}).to_excel(writer, sheet_name="data", index=False)
        print("RESULT", json.dumps(pd.read_excel("report.xlsx", sheet_name="data")["x"].tolist()))
        """,
        result([1, 2, 3]),
    ),
    Program(
        "parquet_round_trip",
        """
        import pandas as pd, json
        df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
        df.to_parquet("t.parquet")
        back = pd.read_parquet("t.parquet")
        print("RESULT", json.dumps([back.equals(df), back["b"].tolist()]))
        """,
        result([True, ["x", "y"]]),
    ),
    Program(
        "feather_round_trip",
        """
        import pandas as pd, pyarrow.feather as feather, json
        feather.write_feather(pd.DataFrame({"v": [0.5, 1.5]}), "t.feather")
        print("RESULT", json.dumps(feather.read_table("t.feather").column("v").to_pylist()))
        """,
        result([0.5, 1.5]),
    ),
    Program(
        "yaml_round_trip",
        """
        import yaml, json
        config = {"model": {"name": "rf", "depth": 3}, "tags": ["a", "b"], "rate": 0.5}
        with open("config.yaml", "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        with open("config.yaml") as f:
            back = yaml.safe_load(f)
        print("RESULT", json.dumps(back))
        """,
        result({"model": {"name": "rf", "depth": 3}, "tags": ["a", "b"], "rate": 0.5}),
    ),
    Program(
        "html_parsing_bs4_lxml",
        """
        from bs4 import BeautifulSoup
        import json
        html = "<ul><li><a href='/a'>A</a></li><li><a href='/b'>B</a></li></ul>"
        soup = BeautifulSoup(html, "lxml")
        print("RESULT", json.dumps([a["href"] for a in soup.find_all("a")]))
        """,
        result(["/a", "/b"]),
    ),
    Program(
        "xml_xpath_lxml",
        """
        from lxml import etree
        import json
        root = etree.fromstring("<r><i n='1'/><i n='2'/><i n='3'/></r>")
        print("RESULT", json.dumps([int(n) for n in root.xpath("//i/@n")]))
        """,
        result([1, 2, 3]),
    ),
    Program(
        "tabulate_table",
        """
        from tabulate import tabulate
        print(tabulate([["x", 1], ["y", 2]], headers=["k", "v"], tablefmt="github"))
        """,
        lambda run: _assert("| k   |   v |" in run.stdout, run.stdout),
    ),
    Program(
        "jinja2_template",
        """
        from jinja2 import Template
        import json
        template = Template("{% for x in xs %}{{ x }};{% endfor %}")
        print("RESULT", json.dumps(template.render(xs=[1, 2])))
        """,
        result("1;2;"),
    ),
    Program(
        "pillow_draw_and_save",
        """
        from PIL import Image, ImageDraw
        import json
        img = Image.new("RGB", (64, 32), "white")
        ImageDraw.Draw(img).rectangle([0, 0, 31, 31], fill="red")
        img.save("box.png")
        back = Image.open("box.png")
        print("RESULT", json.dumps([back.size, back.getpixel((5, 5)), back.getpixel((50, 5))]))
        """,
        all_of(
            result([[64, 32], [255, 0, 0], [255, 255, 255]]),
            lambda run: _assert(run.files["box.png"]["mime"] == "image/png", run.files),
        ),
    ),
    # -- science -----------------------------------------------------------------------------
    Program(
        "sklearn_linear_regression",
        """
        import numpy as np, json
        from sklearn.linear_model import LinearRegression
        X = np.arange(10, dtype=float).reshape(-1, 1)
        model = LinearRegression().fit(X, 3 * X.ravel() + 2)
        print("RESULT", json.dumps([float(model.coef_[0]), float(model.intercept_),
                                    float(model.predict([[10.0]])[0])]))
        """,
        close([3.0, 2.0, 32.0]),
    ),
    Program(
        "sklearn_iris_random_forest",
        """
        import json
        from sklearn.datasets import load_iris
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.metrics import accuracy_score
        from sklearn.model_selection import train_test_split
        X, y = load_iris(return_X_y=True, as_frame=True)
        X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
        clf = RandomForestClassifier(n_estimators=50, random_state=0).fit(X_tr, y_tr)
        acc = accuracy_score(y_te, clf.predict(X_te))
        print("RESULT", json.dumps([acc > 0.85, len(clf.feature_importances_)]))
        """,
        result([True, 4]),
    ),
    Program(
        "sklearn_pipeline_set_output",
        """
        import json
        from sklearn.datasets import make_classification
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        import pandas as pd
        X, y = make_classification(n_samples=300, n_features=5, random_state=0)
        X = pd.DataFrame(X, columns=[f"f{i}" for i in range(5)])
        scaled = StandardScaler().set_output(transform="pandas").fit_transform(X)
        pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
        print("RESULT", json.dumps([list(scaled.columns), pipe.score(X, y) > 0.8,
                                    abs(float(scaled["f0"].mean())) < 1e-9]))
        """,
        result([["f0", "f1", "f2", "f3", "f4"], True, True]),
    ),
    Program(
        "sklearn_kmeans",
        """
        import numpy as np, json
        from sklearn.cluster import KMeans
        pts = np.array([[0, 0], [0, 1], [1, 0], [10, 10], [10, 11], [11, 10]], dtype=float)
        labels = KMeans(n_clusters=2, n_init="auto", random_state=0).fit_predict(pts)
        print("RESULT", json.dumps([len(set(labels[:3])), len(set(labels[3:])),
                                    bool(labels[0] != labels[3])]))
        """,
        result([1, 1, True]),
    ),
    Program(
        "statsmodels_formula_ols",
        """
        import numpy as np, pandas as pd, json
        import statsmodels.formula.api as smf
        df = pd.DataFrame({"x": np.arange(20.0)})
        df["y"] = 1.0 + 2.0 * df["x"]
        fit = smf.ols("y ~ x", data=df).fit()
        print("RESULT", json.dumps([float(fit.params["Intercept"]), float(fit.params["x"]),
                                    float(fit.rsquared)]))
        """,
        close([1.0, 2.0, 1.0]),
    ),
    Program(
        "statsmodels_ols_summary",
        """
        import numpy as np, statsmodels.api as sm
        rng = np.random.default_rng(0)
        x = rng.normal(size=200)
        y = 0.5 + 1.5 * x + rng.normal(scale=0.1, size=200)
        fit = sm.OLS(y, sm.add_constant(x)).fit()
        print(fit.summary())
        print("RESULT", round(float(fit.params[1]), 1))
        """,
        all_of(close(1.5), lambda run: _assert("OLS Regression Results" in run.stdout, "")),
    ),
    Program(
        "sympy_solve",
        """
        import sympy as sp, json
        x = sp.symbols("x")
        roots = sp.solve(sp.Eq(x**2 - 5*x + 6, 0), x)
        print("RESULT", json.dumps(sorted(int(r) for r in roots)))
        """,
        result([2, 3]),
    ),
    Program(
        "sympy_calculus",
        """
        import sympy as sp, json
        x = sp.symbols("x")
        integral = sp.integrate(sp.sin(x) ** 2, (x, 0, sp.pi))
        derivative = sp.diff(x**3 * sp.exp(x), x)
        print("RESULT", json.dumps([str(integral), str(sp.factor(derivative))]))
        """,
        result(["pi/2", "x**2*(x + 3)*exp(x)"]),
    ),
    Program(
        "scipy_optimize_integrate_stats",
        """
        import numpy as np, json
        from scipy import integrate, optimize, stats
        best = optimize.minimize(lambda v: (v[0] - 3) ** 2 + 1, x0=[0.0]).x[0]
        area, _ = integrate.quad(lambda t: np.exp(-t * t), -np.inf, np.inf)
        fit = stats.linregress([0, 1, 2, 3], [1, 3, 5, 7])
        print("RESULT", json.dumps([float(best), area, fit.slope, fit.intercept]))
        """,
        close([3.0, 1.7724538509055159, 2.0, 1.0], tol=1e-5),
    ),
    Program(
        "networkx_paths",
        """
        import networkx as nx, json
        g = nx.Graph([("a", "b"), ("b", "c"), ("a", "d"), ("d", "c"), ("c", "e")])
        g["a"]["d"]["weight"] = 5
        path = nx.shortest_path(g, "a", "e", weight="weight")
        rank = nx.pagerank(g)
        print("RESULT", json.dumps([path, round(sum(rank.values()), 6)]))
        """,
        result([["a", "b", "c", "e"], 1.0]),
    ),
    # -- charts ------------------------------------------------------------------------------
    Program(
        "matplotlib_plot_show",
        """
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([1, 3, 2], label="series")
        ax.legend()
        plt.show()
        """,
        one_chart(),
    ),
    Program(
        "matplotlib_figure_left_open",
        """
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 2)
        for i, ax in enumerate(axes.flat):
            ax.bar(["a", "b"], [i, i + 1])
        fig.suptitle("four panels")
        """,
        one_chart(),
    ),
    Program(
        "matplotlib_agg_then_show",
        """
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.plot([0, 1, 4, 9])
        plt.title("squares")
        plt.show()
        """,
        one_chart(),
        fresh=True,
    ),
    Program(
        "matplotlib_agg_left_open_and_savefig",
        """
        import matplotlib
        matplotlib.use("agg")
        import matplotlib.pyplot as plt
        import numpy as np
        fig, ax = plt.subplots()
        ax.hist(np.random.default_rng(0).normal(size=500), bins=20)
        fig.savefig("hist.png")
        rgba = np.asarray(fig.canvas.buffer_rgba())
        print("RESULT", rgba.ndim, rgba.shape[2])
        """,
        all_of(
            one_chart(),
            lambda run: _assert(run.files["hist.png"]["mime"] == "image/png", run.files),
            lambda run: _assert("RESULT 3 4" in run.stdout, run.stdout),
        ),
        fresh=True,
    ),
    Program(
        "matplotlib_switch_backend_after_import",
        """
        import matplotlib.pyplot as plt
        plt.switch_backend("agg")
        plt.plot([3, 1, 2])
        plt.show()
        plt.plot([1, 2])
        """,
        lambda run: _assert(len(run.pngs) == 2, [list(d["data"]) for d in run.named("display")]),
        fresh=True,
    ),
    Program(
        "matplotlib_empty_figure_not_sent",
        """
        import matplotlib.pyplot as plt
        empty = plt.figure()
        fig, ax = plt.subplots()
        ax.scatter([1, 2], [2, 1])
        plt.show()
        """,
        all_of(
            one_chart(),
            lambda run: _assert(len(run.named("display")) == 1, run.named("display")),
        ),
    ),
    Program(
        "seaborn_chart",
        """
        import numpy as np, pandas as pd, seaborn as sns, matplotlib.pyplot as plt
        rng = np.random.default_rng(1)
        df = pd.DataFrame({"g": np.repeat(["a", "b"], 50), "v": rng.normal(size=100)})
        sns.boxplot(data=df, x="g", y="v", hue="g")
        plt.show()
        """,
        one_chart(),
    ),
    Program(
        "pandas_plot",
        """
        import pandas as pd, matplotlib.pyplot as plt
        ax = pd.Series([1, 4, 2], index=["x", "y", "z"]).plot.bar(title="bars")
        plt.tight_layout()
        plt.show()
        """,
        one_chart(),
    ),
    Program(
        "chinese_labels_default",
        textwrap.dedent(
            """
        import json
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        ax.bar(["一月", "二月"], [3, 5])
        ax.set_title("销售额（万元）")
        ax.set_xlabel("月份")
        """
        ).strip()
        + CJK_CHECK,
        cjk_check,
    ),
    Program(
        "chinese_labels_simhei_as_on_windows",
        textwrap.dedent(
            """
        import json
        import matplotlib.pyplot as plt
        plt.rcParams["font.sans-serif"] = ["SimHei"]
        plt.rcParams["axes.unicode_minus"] = False
        fig, ax = plt.subplots()
        ax.plot([-1, 0, 1])
        ax.set_title("温度变化 −1℃")
        """
        ).strip()
        + CJK_CHECK,
        cjk_check,
        fresh=True,
    ),
    Program(
        "chinese_labels_after_seaborn_theme",
        textwrap.dedent(
            """
        import json
        import seaborn as sns, matplotlib.pyplot as plt
        sns.set_theme(style="whitegrid")
        fig, ax = plt.subplots()
        sns.lineplot(x=[1, 2, 3], y=[2, 1, 3], ax=ax)
        ax.set_title("用户增长 日本語 한국어")
        """
        ).strip()
        + CJK_CHECK,
        cjk_check,
        fresh=True,
    ),
    Program(
        "plotly_html_and_json",
        """
        import json
        import plotly.express as px
        fig = px.bar(x=["a", "b"], y=[1, 3], title="plotly bars")
        fig.write_html("bars.html", include_plotlyjs=True)
        spec = json.loads(fig.to_json())
        print("RESULT", json.dumps([spec["data"][0]["type"], list(spec["data"][0]["y"])]))
        """,
        all_of(
            lambda run: _assert(run.value()[0] == "bar", run.stdout),
            # plotly.js inside
            lambda run: _assert(run.files["bars.html"]["size"] > 1_000_000, run.files),
        ),
    ),
    Program(
        "plotly_show_displays",
        """
        import plotly.graph_objects as go
        go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2])).show()
        """,
        lambda run: _assert(
            any(
                "application/vnd.plotly.v1+json" in d["data"] or "text/html" in d["data"]
                for d in run.named("display")
            ),
            [list(d["data"]) for d in run.named("display")],
        ),
    ),
    # -- habits of generated scripts ---------------------------------------------------------
    Program(
        "stdout_buffer_write",
        """
        import sys
        sys.stdout.buffer.write(b"raw bytes\\n")
        sys.stdout.buffer.write("中文输出\\n".encode("utf-8"))
        sys.stdout.buffer.flush()
        """,
        lambda run: _assert(run.stdout == "raw bytes\n中文输出\n", run.stdout),
    ),
    Program(
        "stdout_rewrapped_utf8",
        """
        import io, sys
        sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8")
        print("你好，世界")
        """,
        lambda run: _assert(run.stdout == "你好，世界\n", run.stdout),
        fresh=True,
    ),
    Program(
        "stdout_reconfigure",
        """
        import sys
        sys.stdout.reconfigure(encoding="utf-8")
        print("ok après reconfigure")
        """,
        lambda run: _assert(run.stdout == "ok après reconfigure\n", run.stdout),
    ),
    Program(
        "argparse_defaults",
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--n", type=int, default=3)
        args = parser.parse_args()
        print("RESULT", args.n * 2)
        """,
        result(6),
    ),
    Program(
        "multiprocessing_pool",
        """
        from multiprocessing import Pool
        def square(v):
            return v * v
        if __name__ == "__main__":
            with Pool(2) as pool:
                print("RESULT", pool.map(square, range(5)))
        """,
        result([0, 1, 4, 9, 16]),
    ),
    Program(
        "tqdm_progress",
        """
        from tqdm import tqdm
        total = sum(i for i in tqdm(range(1000)))
        print("RESULT", total)
        """,
        all_of(result(499500), lambda run: _assert("100%" in run.stderr, run.stderr)),
    ),
    Program(
        "requests_fails_fast_offline",
        """
        import json, time, requests
        t = time.monotonic()
        try:
            requests.get("https://pypi.org/simple/", timeout=5)
            outcome = "reached"
        except requests.exceptions.ConnectionError:
            outcome = "ConnectionError"
        print("RESULT", json.dumps([outcome, time.monotonic() - t < 5]))
        """,
        lambda run: _assert(run.value() == ["ConnectionError", True], run.stdout),
    ),
    Program(
        "pip_install_present_package",
        "!pip install numpy pandas",
        lambda run: _assert(
            run.stdout.count("Requirement already satisfied") >= 2, run.stdout + run.stderr
        ),
    ),
    Program(
        "pip_install_missing_fails_fast",
        "%pip install kg-no-such-package-16",
        all_of(
            lambda run: _assert("no network access" in run.stderr, run.stdout + run.stderr),
            lambda run: _assert("build-image --requirements" in run.stderr, run.stderr),
            lambda run: _assert(run.seconds < 20, run.seconds),
        ),
    ),
]


def _assert(condition: object, context: object) -> None:
    assert condition, context


@pytest.fixture(scope="module")
def corpus_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    require_docker()
    settings = settings_for(
        "docker",
        tmp_path_factory.mktemp("corpus"),
        pool_size=2,
        exec_timeout=120.0,
        max_sessions=4,
    )
    with ServerThread(settings) as server:
        yield server


@pytest.fixture(scope="module")
def http(corpus_gateway: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=corpus_gateway.url, timeout=180) as client:
        yield client


@pytest.fixture(scope="module")
def shared_session(http: httpx.Client) -> Iterator[str]:
    response = http.post("/sessions")
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    yield sid
    http.delete(f"/sessions/{sid}")


def run_program(http: httpx.Client, session_id: str, program: Program) -> Run:
    code = textwrap.dedent(program.code).strip() + "\n"
    url = "/execute" if program.fresh else f"/sessions/{session_id}/execute"
    started = time.monotonic()
    response = http.post(url, json={"code": code, "timeout": 120}, headers=JSON)
    seconds = time.monotonic() - started
    assert response.status_code == 200, response.text
    body = response.json()
    return Run(
        status=body["status"],
        stdout=body["stdout"],
        stderr=body["stderr"],
        error=body.get("error"),
        events=body["events"],
        seconds=seconds,
    )


def test_corpus_has_at_least_forty_programs() -> None:
    assert len(PROGRAMS) >= 40
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program(http: httpx.Client, shared_session: str, program: Program) -> None:
    run = run_program(http, shared_session, program)
    if run.error is not None:
        pytest.fail(f"{run.error['ename']}: {run.error['evalue']}", pytrace=False)
    assert run.status == "ok", (run.status, run.stderr[-2000:])
    program.check(run)
