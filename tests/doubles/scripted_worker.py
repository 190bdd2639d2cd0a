"""`genjob` with the models replaced by the scripted stand-in: ``python -m scripted_worker worker -Q …``.

The test plugin for worker processes: it swaps the runner builder (``PROCESS.runners.build``) before the
CLI starts the Celery worker, whose pool children inherit it; the production Settings know nothing of it.
"""

from model_doubles import scripted_runner

from genjob.cli import main
from genjob.worker.chunks import PROCESS

PROCESS.runners.build = scripted_runner

if __name__ == "__main__":
    main()
