"""Start one IPython kernel on the connection file the gateway wrote.

The gateway puts its in-kernel startup code (`startup.py`) next to the
connection file on every launch (it seeds matplotlib's font cache, routes
thread output, and hardens output capture), so this image never goes stale
against the gateway's version. Without it a plain ipykernel starts.
"""

import os
import runpy
import sys


def main() -> None:
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
