"""The model allow-list: names resolve to target + draft, the API refuses paths, the CLI takes both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_jsonl

from genjob.catalog import JobOptionsError, build_job_spec, resolve_model
from genjob.cli import main
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.tables import Job

SETTINGS = Settings(
    models={
        "demo": {"target": "/m/target", "draft": "/m/draft"},
        "small": "/m/small",
        "other": {"target": "/m/o"},
    }
)


def test_a_name_resolves_to_its_paths() -> None:
    entry = resolve_model(SETTINGS, "demo", allow_paths=False)
    assert (entry.target, entry.draft) == ("/m/target", "/m/draft")
    assert resolve_model(SETTINGS, "small", allow_paths=False).target == "/m/small"


def test_paths_only_where_allowed() -> None:
    assert resolve_model(SETTINGS, "/some/path", allow_paths=True).target == "/some/path"
    with pytest.raises(JobOptionsError, match=r"unknown model '/some/path': .* one of: demo, small, other"):
        resolve_model(SETTINGS, "/some/path", allow_paths=False)
    with pytest.raises(JobOptionsError, match=r"none are configured \(GENJOB_MODELS\)"):
        resolve_model(Settings(), "x", allow_paths=False)


def test_job_spec_defaults() -> None:
    spec = build_job_spec(SETTINGS, model="demo", allow_paths=False)
    assert (spec.model, spec.assistant, spec.mode, spec.max_new_tokens) == (
        "/m/target",
        "/m/draft",
        "draft",
        128,
    )
    plain = build_job_spec(SETTINGS, model="demo", mode="none", allow_paths=False)
    assert (plain.assistant, plain.mode) == (None, "none")
    lookup = build_job_spec(SETTINGS, model="demo", mode="prompt-lookup", allow_paths=False)
    assert (lookup.assistant, lookup.mode) == (None, "prompt-lookup")
    assert build_job_spec(SETTINGS, model="small", allow_paths=False).mode == "none"
    named_draft = build_job_spec(SETTINGS, model="small", assistant="other", allow_paths=True)
    assert (named_draft.assistant, named_draft.mode) == ("/m/o", "draft")


def test_job_spec_errors_name_the_option() -> None:
    with pytest.raises(JobOptionsError, match=r"^top_p: Input should be less than or equal to 1$") as info:
        build_job_spec(SETTINGS, model="demo", top_p=2.0, allow_paths=False)
    assert info.value.field == "top_p"
    with pytest.raises(JobOptionsError, match="max_new_tokens must be between 1 and 8192, got 9000"):
        build_job_spec(SETTINGS, model="demo", max_new_tokens=9000, allow_paths=False)
    with pytest.raises(JobOptionsError, match="seed: Input should be greater than or equal to 0"):
        build_job_spec(SETTINGS, model="demo", seed=-1, allow_paths=False)


def test_the_cli_accepts_a_name_from_the_allow_list(
    embedded_env: str, tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, draft = tiny_pair
    monkeypatch.setenv("GENJOB_MODELS", json.dumps({"tiny": {"target": str(target), "draft": str(draft)}}))
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "def f():"})])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "tiny", "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    with session_scope(embedded_env) as session:
        job = session.get(Job, result.output.strip())
        assert (job.model, job.assistant, job.mode, job.status) == (
            str(target),
            str(draft),
            "draft",
            "completed",
        )


def test_no_code_ever_trusts_remote_code() -> None:
    root = Path(__file__).resolve().parents[2]
    sources = [p for d in ("genjob", "worker", "api") for p in (root / d).rglob("*.py")]
    offenders = [str(p) for p in sources if "trust_remote_code=True" in p.read_text(encoding="utf-8")]
    assert sources and offenders == []


def test_relative_allow_list_paths_resolve_against_the_stated_base(tmp_path: Path) -> None:
    """GENJOB_MODELS_DIR (else this directory) is where relative paths start; jobs store them absolute."""
    (tmp_path / "here").mkdir()
    settings = Settings(
        models={
            "a": {"target": "models/demo/target", "draft": "./models/demo/draft"},
            "b": {"target": "here"},
            "c": {"target": "org/name"},
            "d": {"target": "~/m"},
        },
        models_dir=str(tmp_path),
    )
    a = resolve_model(settings, "a", allow_paths=False)
    assert (a.target, a.draft) == (str(tmp_path / "models/demo/target"), str(tmp_path / "models/demo/draft"))
    assert resolve_model(settings, "b", allow_paths=False).target == str(tmp_path / "here")
    assert resolve_model(settings, "c", allow_paths=False).target == "org/name"  # a hub id
    assert resolve_model(settings, "d", allow_paths=False).target == str(Path("~/m").expanduser())


def test_a_misspelt_name_gets_a_suggestion_on_the_api_too() -> None:
    with pytest.raises(
        JobOptionsError, match=r"unknown model 'demoo': did you mean 'demo'\? models are named"
    ):
        resolve_model(SETTINGS, "demoo", allow_paths=False)
