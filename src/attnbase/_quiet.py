"""Quiet, scriptable output: third-party progress bars and INFO logs only with ``--verbose``.

transformers draws ``Loading weights`` / ``Writing model shards`` bars (tqdm, on stderr, also
when piped) and Prefect logs INFO lines (flow and task states, the temporary server's address and
a link to its docs). attnbase's own progress (rich, transient, only on a terminal) and results
are unaffected. A bottom module: it imports no stage, so the CLI calls it before any command
imports transformers or Prefect.
"""

from __future__ import annotations

import os
import sys

#: Environment that silences the third-party output; ``setdefault``, so a value the user set
#: (e.g. ``PREFECT_LOGGING_LEVEL=INFO``) wins.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' tqdm bars follow huggingface_hub's switch
    "TRANSFORMERS_VERBOSITY": "error",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # tqdm bars drawn outside those switches (transformers' GGUF dequantisation); read by tqdm
    # when it is imported
    "TQDM_DISABLE": "1",
}


def quiet_third_party(verbose: bool = False) -> None:
    """Silence (or, with ``verbose``, leave alone) transformers' bars and Prefect's INFO logs."""
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    tf = sys.modules.get("transformers")
    if tf is not None:  # already imported (in-process callers): its switch was read at import
        from transformers.utils import logging as tf_logging

        tf_logging.disable_progress_bar()
        tf_logging.set_verbosity_error()
