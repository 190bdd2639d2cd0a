"""The model allow-list: names resolve to target + draft, the API refuses paths, the CLI takes both."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from genjob.catalog import JobOptionsError, resolve_model
from genjob.cli import main
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.tables import Job
from tests.support.models import cache_hub_model
from tests.support.prompts import write_jsonl
from tests.support.specs import build_job_spec

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


def test_paths_only_where_allowed(tmp_path: Path) -> None:
    assert resolve_model(SETTINGS, str(tmp_path), allow_paths=True).target == str(tmp_path)
    with pytest.raises(JobOptionsError, match=r"unknown model '/some/path': .* one of: demo, small, other"):
        resolve_model(SETTINGS, "/some/path", allow_paths=False)
    with pytest.raises(
        JobOptionsError, match=r"^unknown model 'x': models are named from the allow-list, one of: smollm2$"
    ):
        resolve_model(Settings(), "x", allow_paths=False)


def test_job_spec_defaults() -> None:
    spec = build_job_spec(SETTINGS, model="demo", allow_paths=False)
    assert (spec.model, spec.assistant, spec.mode, spec.max_new_tokens) == (
        "/m/target",
        "/m/draft",
        "auto",  # every proposer the job can have: its draft among them
        128,
    )
    plain = build_job_spec(SETTINGS, model="demo", mode="none", allow_paths=False)
    assert (plain.assistant, plain.mode) == (None, "none")
    lookup = build_job_spec(SETTINGS, model="demo", mode="prompt-lookup", allow_paths=False)
    assert (lookup.assistant, lookup.mode) == (None, "prompt-lookup")
    no_draft = build_job_spec(SETTINGS, model="small", allow_paths=False)
    assert (no_draft.assistant, no_draft.mode) == (None, "auto")  # prompt lookup and the job's outputs
    named_draft = build_job_spec(SETTINGS, model="small", assistant="other", allow_paths=True)
    assert (named_draft.assistant, named_draft.mode) == ("/m/o", "auto")
    draft = build_job_spec(SETTINGS, model="small", assistant="other", mode="draft", allow_paths=True)
    assert (draft.assistant, draft.mode) == ("/m/o", "draft")


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
            "auto",
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


NOT_THERE = (
    "not a path here, nor a hub id in the local Hugging Face cache; hub ids need network: "
    "download it first (hf download ID)"
)


def test_a_hub_id_is_taken_only_from_the_local_cache(hub_cache: Path) -> None:
    cache_hub_model(hub_cache, "org/cached")
    assert resolve_model(SETTINGS, "org/cached", allow_paths=True).target == "org/cached"
    with pytest.raises(JobOptionsError) as info:
        resolve_model(SETTINGS, "org/elsewhere", allow_paths=True)
    assert (
        str(info.value)
        == f"unknown model 'org/elsewhere' (catalog: demo, small, other, smollm2): {NOT_THERE}"
    )
    assert info.value.field == "model"
    with pytest.raises(JobOptionsError, match=r"^unknown model 'x' \(catalog: smollm2\): "):
        resolve_model(Settings(), "x", allow_paths=True)
    with pytest.raises(
        JobOptionsError, match=r"^unknown model 'org/cached': .* one of: demo, small, other, smollm2$"
    ):
        resolve_model(SETTINGS, "org/cached", allow_paths=False)  # the API: the allow-list only


@pytest.mark.parametrize(
    "name", ["/no/such/dir", "./target", "../target", "~/no-such-genjob-model", "a/b/c", "models/targt"]
)
def test_a_path_that_does_not_exist_is_refused(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").mkdir()  # so models/targt is a path here, not the hub id of an org "models"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JobOptionsError) as info:
        resolve_model(SETTINGS, name, allow_paths=True)
    assert str(info.value) == f"no such model directory: {Path(name).expanduser().absolute()}"
    assert info.value.field == "model"


def test_an_existing_path_is_taken_as_given_and_home_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "demo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model(SETTINGS, "models/demo", allow_paths=True).target == "models/demo"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model(SETTINGS, "~/models", allow_paths=True).target == str(tmp_path / "models")


def submit_quickly(*args: str) -> tuple[int, str]:
    """`genjob submit p.jsonl ARGS`: its exit code and output, after checking it took under 5 s."""
    started = time.monotonic()
    result = CliRunner().invoke(main, ["submit", "p.jsonl", *args])
    assert time.monotonic() - started < 5
    return result.exit_code, result.output


@pytest.fixture
def typo_env(embedded_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded mode with one listed model, a prompt file, and the hub reachable as far as anyone says."""
    monkeypatch.setenv("GENJOB_MODELS", json.dumps({"tiny": {"target": "/m/target", "draft": "/m/draft"}}))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "a"})])


def test_the_cli_refuses_a_name_that_is_not_a_model_at_once(typo_env: None) -> None:
    assert submit_quickly("-m", "demoo") == (
        1,
        f"Error: invalid job options: unknown model 'demoo' (catalog: tiny, smollm2): {NOT_THERE}\n",
    )
    assert submit_quickly("-m", "tiny", "-a", "drafty") == (
        1,
        "Error: invalid job options: unknown assistant model 'drafty' (catalog: tiny, smollm2): "
        f"{NOT_THERE}\n",
    )


def test_the_cli_refuses_a_local_path_that_does_not_exist(typo_env: None, tmp_path: Path) -> None:
    (tmp_path / "models" / "demo").mkdir(parents=True)
    assert submit_quickly("-m", "models/demo/targt") == (
        1,
        f"Error: invalid job options: no such model directory: {tmp_path / 'models/demo/targt'}\n",
    )
    assert submit_quickly("-m", "tiny", "-a", "./models/demo/draftt") == (
        1,
        f"Error: invalid job options: no such model directory: {tmp_path / 'models/demo/draftt'}\n",
    )
