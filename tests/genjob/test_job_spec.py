"""A job's spec decided once: defaults and bounds declared in ``genjob.options``, an unset option taking
its setting in one place, the mode's declared default the one a submit gets, the line-over-job rule and
the context rule each written once."""

from __future__ import annotations

import pytest

from genjob.catalog import JobOptionsError
from genjob.constants import DecodingMode
from genjob.formats.lines import InputLimits
from genjob.generation.context_fit import context_problem
from genjob.options import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_NEW_TOKENS_LIMIT,
    JobSpec,
    line_or_job,
    max_new_tokens_problem,
)
from genjob.settings import Settings
from tests.support.specs import build_job_spec

MODELS = {"demo": {"target": "/m/target", "draft": "/m/draft"}, "plain": "/m/plain"}
SETTINGS = Settings(models=MODELS)


def test_the_defaults_settings_and_the_line_limits_take_are_the_options() -> None:
    settings = Settings()
    assert settings.max_new_tokens == DEFAULT_MAX_NEW_TOKENS == JobSpec(model="m").max_new_tokens
    assert settings.max_new_tokens_limit == MAX_NEW_TOKENS_LIMIT == InputLimits().max_new_tokens_limit


def test_an_unset_option_takes_its_setting_and_a_given_one_wins() -> None:
    settings = Settings(chunk_size=7, max_new_tokens=33, batch_size=5, models=MODELS)
    assert settings.option_or_setting("chunk_size", None) == 7
    assert settings.option_or_setting("chunk_size", 3) == 3
    assert settings.option_or_setting("batch_size", None) == 5
    assert Settings().option_or_setting("batch_size", None) is None  # the device decides
    assert build_job_spec(settings, allow_paths=False, model="demo").max_new_tokens == 33
    assert build_job_spec(settings, allow_paths=False, model="demo", max_new_tokens=9).max_new_tokens == 9


def test_the_mode_a_submit_gets_is_the_specs_declared_default() -> None:
    assert JobSpec.model_fields["mode"].default is DecodingMode.AUTO
    with_draft = build_job_spec(SETTINGS, allow_paths=False, model="demo")
    assert (with_draft.mode, with_draft.assistant) == (DecodingMode.AUTO, "/m/draft")
    assert JobSpec(model="/m/target", assistant="/m/draft") == with_draft
    without = build_job_spec(SETTINGS, allow_paths=False, model="plain")
    assert (without.mode, without.assistant) == (DecodingMode.AUTO, None)


def test_one_range_check_for_the_jobs_max_new_tokens_and_a_lines() -> None:
    assert max_new_tokens_problem(1, 10) is None and max_new_tokens_problem(10, 10) is None
    assert max_new_tokens_problem(0, 10) == "must be between 1 and 10, got 0"
    too_many = {"model": "demo", "max_new_tokens": 21}
    with pytest.raises(JobOptionsError, match="max_new_tokens must be between 1 and 20, got 21"):
        build_job_spec(Settings(max_new_tokens_limit=20, models=MODELS), allow_paths=False, **too_many)


def test_a_lines_value_wins_over_the_jobs() -> None:
    assert line_or_job(None, 16) == 16 and line_or_job(4, 16) == 4 and line_or_job(0.0, 0.7) == 0.0


def test_one_context_rule() -> None:
    assert context_problem(10, 6, 16) is None and context_problem(10, 6, None) is None
    assert context_problem(10, 7, 16) == (
        "prompt of 10 tokens + max_new_tokens 7 exceeds the model's context of 16 tokens"
    )


def test_baseline_fraction_gives_the_rounds_between_plain_ones() -> None:
    assert JobSpec(model="m", baseline_fraction=0.05).baseline_every == 20
    assert JobSpec(model="m", baseline_fraction=0.3).baseline_every == 3
    assert JobSpec(model="m", baseline_fraction=1.0).baseline_every == 1
    assert JobSpec(model="m", baseline_fraction=0).baseline_every == 0
