"""Start one IPython kernel on the connection file the gateway wrote.

The gateway puts its in-kernel startup code (`startup.py`) next to the
connection file, so the image never goes stale against the gateway version;
without it a plain ipykernel starts.

Matplotlib insists on a writable config dir and the root filesystem is
read-only, so the font cache built into the image is first copied to /tmp
(a cold font scan would cost the first chart over a second).
"""

import os
import runpy
import shutil
import sys


def _seed_font_cache() -> None:
    source = os.environ.get("MPL_FONT_CACHE_SEED")
    target = os.environ.get("MPLCONFIGDIR")
    if not source or not target or not os.path.isdir(source):
        return
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(source):
        if name.endswith(".json") and not os.path.exists(os.path.join(target, name)):
            shutil.copy(os.path.join(source, name), target)


def main() -> None:
    _seed_font_cache()
    connection_file = sys.argv[1]
    startup = os.path.join(os.path.dirname(connection_file), "startup.py")
    argv = ["-f", connection_file]
    if os.path.exists(startup):
        sys.argv = [startup, *argv]
        runpy.run_path(startup, run_name="__main__")
    else:
        from ipykernel.kernelapp import launch_new_instance

        launch_new_instance(argv=argv)


if __name__ == "__main__":
    main()
