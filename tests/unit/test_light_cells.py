"""Which fork template a stateless cell goes to (kernels/pools/light.py), and the setting
that chooses the light template's modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_gateway.kernels.pools.light import MAX_CHARS, is_light, roots
from kernel_gateway.settings import Settings

LIGHT = roots(["numpy", "matplotlib"])


@pytest.mark.parametrize(
    "code",
    [
        "print(1)",
        "1 + 1",
        "import math, json as j\nprint(math.pi)",
        "import numpy as np\nfrom matplotlib import pyplot as plt\nplt.plot(np.arange(3))",
        "import os.path\nfrom os import (path,\n    sep)",
        "import numpy.linalg as la; print(la.norm([3, 4]))",
        "from __future__ import annotations\nimport typing",
        "s = 'important'  # not the word itself",
        "def f(:",  # a syntax error is the same error in either template
        "import re\nprint(re.compile('a+').match('aa'))",  # a method, not the builtin
        "model.eval()",
        "import os\r\nimport json\r\n",
    ],
)
def test_cells_that_import_only_standard_or_light_modules_are_light(code: str) -> None:
    assert is_light(code, LIGHT)


@pytest.mark.parametrize(
    "code",
    [
        "import pandas as pd",
        "import numpy as np, pandas",
        "x = 1; import pandas",
        "from pandas import DataFrame",
        "import seaborn",  # a library that imports pandas itself
        "import mymodule",  # a file of the workspace, or anything not known
        "from . import sibling",
        "import pickle\npickle.loads(data)",  # unpickling imports the pickled classes
        "import importlib\nimportlib.import_module('pandas')",
        "__import__('pandas')",
        "exec('import pandas')",
        "x = eval('1')",
        "get_ipython().run_line_magic('time', '1')",
        "%timeit sum(range(10))",
        "  !pip list",
        "print('import pandas')",  # an import word it cannot tell from code
        "import numpy as np, \\\n    pandas as pd",  # a continued line
        "import os\rimport pandas",  # old Mac line ends
        "compile('1', 'x', 'eval')",
        "print(1)\n" + " " * MAX_CHARS,  # too long to read on the event loop
    ],
)
def test_cells_that_may_need_more_go_to_the_full_template(code: str) -> None:
    assert not is_light(code, LIGHT)


def test_with_no_light_modules_only_standard_imports_are_light() -> None:
    assert is_light("import sys", frozenset())
    assert not is_light("import numpy", frozenset())


@pytest.mark.parametrize(
    ("preload", "light", "expected"),
    [
        ("numpy,pandas,matplotlib", "numpy,matplotlib", ["numpy", "matplotlib"]),
        ("numpy,pandas,matplotlib", "matplotlib,numpy,scipy", ["numpy", "matplotlib"]),
        ("numpy,pandas,matplotlib", "", []),  # one template
        ("numpy,matplotlib", "numpy,matplotlib", []),  # it would hold everything: one
        ("", "numpy,matplotlib", []),
        ("pandas", "numpy", []),  # nothing of --preload in it: one template
    ],
)
def test_the_light_template_is_a_part_of_the_preload(
    tmp_path: Path, preload: str, light: str, expected: list[str]
) -> None:
    settings = Settings(runtime_dir=tmp_path, preload=preload, fork_light_preload=light)
    assert settings.fork_light_preload_list == expected


def test_a_bad_light_module_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fork-light-preload"):
        Settings(runtime_dir=tmp_path, fork_light_preload="numpy,not a module")
