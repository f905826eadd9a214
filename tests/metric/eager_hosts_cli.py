"""``qace score`` whose scorer starts its host processes, and waits for them, when it is built.

    python -m tests.metric.eager_hosts_cli score INPUT -o OUT ... --host-workers 2

A long input's run uses host processes from their start; its first chunks are scored in the main
process while they start (`qace.api.QACE.start_host_processes`). The process tests kill a host process,
or the run, once the run has committed a chunk and its host processes are up: a run that scored its
first chunks in the main process could finish before the test acts, on a loaded machine. Starting them
first makes every chunk a host process's, as in a long run once they are ready.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from qace import cli

_build = cli._scorer


def _eager(args: Any, models: str | None = None) -> Any:
    scorer = _build(args, models)
    scorer.start_host_processes(wait=True)
    return scorer


if __name__ == "__main__":
    # Ctrl-C as a terminal's foreground job gets it: a test run started in the background by a
    # non-interactive shell (`pytest &` in a script) hands SIGINT on ignored, and Python keeps it so
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cli._scorer = _eager
    sys.exit(cli.main(sys.argv[1:]))
