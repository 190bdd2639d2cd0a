"""A model genjob cannot decode (ALiBi: Bloom, Falcon with ``alibi``): ``genjob submit`` refuses a local
one up front from its config, and a worker that loads one (a hub id, unseen at submit) fails its job with
one line on every item, no traceback, no retry."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from genjob.cli import main
from genjob.db import session_scope
from genjob.tables import Item, Job
from tests.support.families import family_config
from tests.support.models import cache_hub_model

REASON = "bloom ALiBi attention is not supported (its bias needs a 2-D padding mask)"


def write_bloom(directory: Path, tokenizer_from: Path) -> Path:
    """A tiny random Bloom with the tiny pair's tokenizer, saved as a checkpoint in ``directory``."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_from)
    config = family_config("bloom")
    config.vocab_size = len(tokenizer)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def prompts(directory: Path, count: int = 3) -> Path:
    path = directory / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"hello {i}"}) + "\n" for i in range(count)))
    return path


def test_submit_refuses_a_local_alibi_model_before_storing_anything(
    embedded_env: str, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    bloom = write_bloom(tmp_path / "bloom", tiny_pair[0])
    result = CliRunner().invoke(main, ["submit", str(prompts(tmp_path)), "-m", str(bloom)])
    assert (result.exit_code, result.output) == (1, f"Error: cannot decode model {str(bloom)!r}: {REASON}\n")
    with session_scope(embedded_env) as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_a_worker_fails_the_job_of_a_model_it_cannot_decode(
    embedded_env: str,
    tiny_pair: tuple[Path, Path],
    hub_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # this machine has no hub: read the suite's cache only
    write_bloom(cache_hub_model(hub_cache, "tiny/bloom"), tiny_pair[0])
    started = time.monotonic()
    result = CliRunner().invoke(main, ["submit", str(prompts(tmp_path)), "-m", "tiny/bloom", "--wait"])
    assert time.monotonic() - started < 30
    assert result.exit_code == 3, result.output  # the documented code for a job with failed items
    assert "Traceback" not in result.output
    line = f"cannot decode model 'tiny/bloom': {REASON}"
    with session_scope(embedded_env) as session:
        job = session.get(Job, result.stdout.strip())
        assert job is not None and (job.status, job.error, job.failed) == ("failed", line, 3)
        items = session.scalars(select(Item).where(Item.job_id == job.id)).all()
        assert [(item.status, item.error, item.attempts) for item in items] == [("failed", line, 0)] * 3
