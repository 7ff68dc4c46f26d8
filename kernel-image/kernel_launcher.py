"""Start one IPython kernel on the connection file the gateway wrote.

Matplotlib insists on a writable config dir; the root filesystem may be
read-only, so the font cache built into the image is copied to /tmp first
(a cold font scan would cost the first chart over a second).
"""

import os
import shutil
import sys


def _seed_font_cache() -> None:
    source = os.environ.get("KG_FONT_CACHE")
    target = os.environ.get("MPLCONFIGDIR")
    if not source or not target or not os.path.isdir(source):
        return
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(source):
        if name.endswith(".json") and not os.path.exists(os.path.join(target, name)):
            shutil.copy(os.path.join(source, name), target)


def main() -> None:
    _seed_font_cache()
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance(argv=["-f", sys.argv[1]])


if __name__ == "__main__":
    main()
