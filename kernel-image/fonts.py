"""Build matplotlib's font cache for the kernel image, with CJK font names mapped.

Run once at image build with MPLCONFIGDIR=/opt/mplcache; kernels start from a copy of
that cache. Code written for Chinese, Japanese or Korean charts names the font it
expects on Windows or macOS (`plt.rcParams['font.sans-serif'] = ['SimHei']`); none of
those exist here, and matplotlib would fall back to DejaVu Sans and draw empty boxes.
So each such name is added to the cache as another name of the CJK font installed.

The build fails when CJK text does not render (a missing glyph, a name not found):
a broken font set-up is caught here rather than in a user's chart.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("agg")

from matplotlib import font_manager as fm  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

CJK_FAMILY = "WenQuanYi Micro Hei"
ALIASES = [
    # Chinese, simplified and traditional (Windows, macOS, Adobe/Google, Linux names)
    "SimHei", "Microsoft YaHei", "Microsoft JhengHei", "SimSun", "NSimSun", "KaiTi",
    "FangSong", "STHeiti", "STSong", "STKaiti", "STFangsong", "Heiti SC", "Heiti TC",
    "PingFang SC", "PingFang TC", "PingFang HK", "Songti SC", "Hiragino Sans GB",
    "Source Han Sans CN", "Source Han Sans SC", "Source Han Sans TC",
    "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans SC", "Noto Sans TC",
    "WenQuanYi Zen Hei", "Droid Sans Fallback", "Arial Unicode MS",
    # Japanese
    "MS Gothic", "Yu Gothic", "Meiryo", "Hiragino Sans", "Hiragino Kaku Gothic Pro",
    "IPAexGothic", "IPAGothic", "TakaoGothic", "Noto Sans CJK JP", "Noto Sans JP",
    # Korean
    "Malgun Gothic", "AppleGothic", "NanumGothic", "Noto Sans CJK KR", "Noto Sans KR",
]  # fmt: skip
SAMPLE = "中文标签 繁體 日本語かな 한국어"


class _Fail(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        raise SystemExit(f"fonts.py: matplotlib warned: {record.getMessage()}")


def main() -> None:
    manager = fm.fontManager
    cjk = [f for f in manager.ttflist if f.name == CJK_FAMILY]
    if not cjk:
        raise SystemExit(f"fonts.py: no font named {CJK_FAMILY!r} (is fonts-wqy-microhei in?)")
    fallback = os.environ.get("CHART_FALLBACK_FONTS", "").split(":")
    if cjk[0].fname not in fallback:
        raise SystemExit(f"fonts.py: CHART_FALLBACK_FONTS does not name {cjk[0].fname}")
    known = {f.name for f in manager.ttflist}
    for alias in ALIASES:
        if alias not in known:
            manager.ttflist.extend(dataclasses.replace(entry, name=alias) for entry in cjk)
    fm.FontManager._findfont_cached.cache_clear()  # type: ignore[attr-defined]
    path = Path(matplotlib.get_cachedir(), f"fontlist-v{fm.FontManager.__version__}.json")
    fm.json_dump(manager, path)
    check(cjk[0].fname)
    print(f"font cache {path}: {len(ALIASES)} CJK names mapped to {CJK_FAMILY}")


def check(cjk_file: str) -> None:
    """Every alias resolves to the CJK font, and CJK text renders without a warning."""
    logging.getLogger("matplotlib.font_manager").addHandler(_Fail())
    for alias in ALIASES:
        found = fm.findfont(fm.FontProperties(family=alias), fallback_to_default=False)
        if found != cjk_file:
            raise SystemExit(f"fonts.py: {alias!r} resolves to {found}, not {cjk_file}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" is a warning
        for family in (None, "SimHei"):
            with plt.rc_context({"font.sans-serif": [family]} if family else {}):
                fig, ax = plt.subplots()
                ax.set_title(SAMPLE)
                ax.plot([1, -2])
                fig.savefig(io.BytesIO(), format="png")
                plt.close(fig)


if __name__ == "__main__":
    main()
