"""`python -m fp4cli.train.torchrun ARGS`: torchrun itself (torch.distributed.run.main), less
the traceback it prints when Ctrl-C or SIGTERM stops it: it exits with 130 instead, after it has
stopped its workers."""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException:
        sys.exit(130)
