"""OpenAI's error shape, which the OpenAI-compatible routes (``/v1/files``, ``/v1/batches``) answer.

``{"error": {"message", "type", "param", "code"}}`` as OpenAI's API does, so the official SDK's
``e.message``, ``e.type``, ``e.param`` and ``e.code`` say what went wrong: ``param`` names the field at
fault (``limit``, ``endpoint``, ``input_file_id``…), ``type`` is OpenAI's class of error
(``invalid_request_error``, ``insufficient_quota``, ``server_error``), and ``code`` OpenAI's code for a
bad parameter (``integer_below_min_value``, ``invalid_value``, ``missing_required_parameter``…) or
else genjob's stable one (``not_found``, ``batch_ended``…). A bad parameter is 400 there, never 422.
The native routes keep genjob's own shape (``genjob.api.errors``), which decides where each applies.
Must not know: the routes, the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from genjob.echo import echoed

OPENAI_PREFIXES = ("/v1/files", "/v1/batches")

# pydantic's error types → OpenAI's codes for a bad parameter.
PARAMETER_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "greater_than": "integer_below_min_value",
    "greater_than_equal": "integer_below_min_value",
    "less_than": "integer_above_max_value",
    "less_than_equal": "integer_above_max_value",
    "string_too_long": "string_above_max_length",
    "string_too_short": "string_below_min_length",
    "too_long": "array_above_max_length",
    "too_short": "array_below_min_length",
    "literal_error": "invalid_value",
    "enum": "invalid_value",
    "json_invalid": "invalid_json",
}

# genjob's codes that OpenAI names otherwise.
RENAMED_CODES = {"unauthorized": "invalid_api_key", "quota_exceeded": "insufficient_quota"}


class OpenAIErrorInfo(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, insufficient_quota or server_error.")
    param: str | None = Field(default=None, description="The parameter at fault, if one is.")
    code: str | None = Field(default=None, description="e.g. integer_below_min_value, not_found.")


class OpenAIErrorResponse(BaseModel):
    error: OpenAIErrorInfo


def is_openai_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in OPENAI_PREFIXES)


def openai_status(status_code: int) -> int:
    """OpenAI answers a bad parameter with 400, where the native routes say 422."""
    return 400 if status_code == 422 else status_code


def error_type(status_code: int, code: str | None) -> str:
    if status_code >= 500:
        return "server_error"
    if code == "quota_exceeded":
        return "insufficient_quota"
    return "invalid_request_error"


def openai_error(status_code: int, code: str, message: str, param: str | None) -> OpenAIErrorInfo:
    """An error raised with genjob's code, in OpenAI's words (a bad value of a named parameter is
    OpenAI's ``invalid_value``)."""
    renamed = "invalid_value" if code == "invalid_request" and param else RENAMED_CODES.get(code, code)
    return OpenAIErrorInfo(message=message, type=error_type(status_code, code), param=param, code=renamed)


def _param(loc: Sequence[Any]) -> str | None:
    parts = [str(part) for part in loc]
    if parts and parts[0] in ("query", "path", "body", "header"):
        parts = parts[1:]
    return ".".join(parts) or None


def _parameter_code(kind: str) -> str:
    if kind in PARAMETER_CODES:
        return PARAMETER_CODES[kind]
    return "invalid_type" if kind.endswith(("_type", "_parsing")) else "invalid_value"


def _sentence(error: Mapping[str, Any], param: str | None) -> str:
    kind, message = str(error.get("type", "")), str(error.get("msg", "invalid"))
    if kind == "json_invalid":
        return f"The body is not valid JSON ({message})."
    if kind == "missing":
        return f"Missing required parameter: '{param}'." if param else "Missing the request body."
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}"
    given = error.get("input")
    got = f", got {echoed(str(given))}" if isinstance(given, str | int | float) else ""
    what = f"Invalid '{param}'" if param else "Invalid request"
    return f"{what}: {message[:1].lower()}{message[1:]}{got}."


def validation_error(errors: Sequence[Mapping[str, Any]]) -> OpenAIErrorInfo:
    """FastAPI's validation errors as OpenAI reports a bad parameter: the first one, named in ``param``."""
    if not errors:
        return OpenAIErrorInfo(message="Invalid request.", type="invalid_request_error")
    first = errors[0]
    kind = str(first.get("type", ""))
    param = None if kind == "json_invalid" else _param(first.get("loc", ()))
    message = _sentence(first, param)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    return OpenAIErrorInfo(
        message=message, type="invalid_request_error", param=param, code=_parameter_code(kind)
    )
