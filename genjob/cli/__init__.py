"""The ``genjob`` command line: parses, calls the library, prints. Every docstring is its help.

Each command's module is imported when that command runs (``genjob.cli.lazy``), so ``genjob --help``
loads click alone. Must not know: the workers, the HTTP API.
"""

from __future__ import annotations

import logging

import click

from genjob import __version__
from genjob.cli.errors import GenjobGroup
from genjob.redaction import install_excepthook, install_log_masking


@click.group(cls=GenjobGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="genjob")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
def main(verbose: int) -> None:
    """genjob: batch LLM generation made fast with assisted generation.

    Submit a JSONL file of prompts, let workers run them with a draft model
    proposing tokens for the target to verify, then read the results and the
    measured speedup. With no GENJOB_BROKER_URL set, everything runs in this
    process on ./genjob.db (the embedded mode).

    Exit codes: 0 done; 1 an error (its message says what to fix); 2 a usage
    error; 3 a job ended with failed items; 4 a job was cancelled or expired;
    5 `wait --timeout` ran out; 130 interrupted; 141 its output was closed
    early (`| head`: it stops quietly).
    """
    install_log_masking()  # every log line and traceback of this process: no password (genjob.redaction)
    install_excepthook()
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
