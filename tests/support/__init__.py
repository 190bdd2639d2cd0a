"""What the tests and the benchmarks share, written once: ``from tests.support.<module> import …``.

    databases   throwaway Postgres databases and Redis queues, a redis-server of a test's own
    processes   the environment of a genjob process; workers (scripted or real) and other services
    waiting     ``wait_for``: a probe until it holds, within a deadline
    jobs        job rows, a job's end, leases and attempts, the exactly-once checks
    prompts     JSONL prompt files; reading one whole through the one reader
    models      tiny target/draft pairs on disk, a model in a Hugging Face cache
    engine      the engine tests' oracle (transformers' greedy decode), drafts, costs, requests
    api         the API tests' key, JSONL bodies, running queued chunks in this process
    store       jobs and results for the store's tests

Fixtures stay in the conftest.py files (they use these). pytest puts the repository root on sys.path
(``pythonpath`` in pyproject.toml); a benchmark run as ``python bench/x.py`` does it with
``from repo_root import ROOT`` (bench/repo_root.py).
"""
