"""Errors as JSON with one stable shape per family of routes, whatever raised them.

On the native routes every error response is ``{"error": {"code": "...", "message": "...", "details":
[...]}}``: ``code`` is a fixed machine-readable string, ``message`` a sentence for people, and
``details`` lists the individual problems, each with the input ``line`` and/or ``field`` it concerns
where there is one. The OpenAI-compatible routes (``/v1/files``, ``/v1/batches``) answer OpenAI's
shape instead, ``{"error": {"message", "type", "param", "code"}}`` (``genjob.api.openai_errors``), the field
at fault in ``param``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ExceptionHandler

from genjob.api.openai_errors import (
    OpenAIErrorInfo,
    OpenAIErrorResponse,
    is_openai_path,
    openai_error,
    openai_status,
    validation_error,
)
from genjob.catalog import JobOptionsError
from genjob.formats.lines import InputFileError
from genjob.options import JobOptions

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    line: int | None = Field(default=None, description="Line of the uploaded file, from 1.")
    field: str | None = Field(default=None, description="Field of the line or of the request.")


class ErrorInfo(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. invalid_input, unauthorized.")
    message: str
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: ErrorInfo


def first_field(details: Sequence[ErrorDetail]) -> str | None:
    """The field at fault of an error: its first detail's that names one (OpenAI's ``param``)."""
    return next((detail.field for detail in details if detail.field), None)


class ApiError(Exception):
    """Raised anywhere in a request to answer with this status and error body."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        details: Sequence[ErrorDetail] = (),
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        """``param``: the field at fault, for OpenAI's shape (default: the first detail's field)."""
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = list(details)
        self.headers = headers
        self.param = param or first_field(self.details)

    @classmethod
    def invalid_input(cls, exc: InputFileError) -> ApiError:
        """422 for a rejected upload: every problem in ``details``, the first one in the message."""
        details = [ErrorDetail(message=e.message, line=e.line, field=e.field) for e in exc.errors]
        if exc.more:
            details.append(ErrorDetail(message=f"… and {exc.more} more errors"))
        others = len(exc.errors) - 1 + exc.more
        message = exc.errors[0].format(exc.source) + (f" (and {others} more)" if others else "")
        return cls(422, "invalid_input", f"{message}; nothing was stored", details=details)


def error_response(
    status_code: int,
    code: str,
    message: str,
    details: Sequence[ErrorDetail] = (),
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(code=code, message=message, details=list(details)))
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code, headers=headers)


# Codes for errors that Starlette raises itself (unknown route, wrong method…).
HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def _answer(
    request: Request,
    status_code: int,
    code: str,
    message: str,
    details: Sequence[ErrorDetail] = (),
    headers: dict[str, str] | None = None,
    *,
    param: str | None = None,
    openai: OpenAIErrorInfo | None = None,
) -> JSONResponse:
    """The error in the shape of the route's family: OpenAI's on its routes, genjob's elsewhere."""
    if not is_openai_path(request.url.path):
        return error_response(status_code, code, message, details, headers)
    param = param or first_field(details)
    info = openai or openai_error(status_code, code, message, param)
    body = OpenAIErrorResponse(error=info).model_dump(mode="json")
    return JSONResponse(body, status_code=openai_status(status_code), headers=headers)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _answer(request, exc.status_code, exc.code, exc.message, exc.details, exc.headers, param=exc.param)


def _job_option_errors(errors: Sequence[Any]) -> JobOptionsError | None:
    """The errors as one JobOptionsError when each is a bad value of a job option (a query parameter
    of ``POST /v1/jobs``): ranges answer ``invalid_options`` whether FastAPI or the catalog finds them.
    A missing or unknown parameter stays ``invalid_request``."""
    option_errors = [
        {**error, "loc": tuple(error["loc"][1:])}
        for error in errors
        if tuple(error.get("loc", ()))[:1] == ("query",)
        and len(error["loc"]) == 2
        and error["loc"][1] in JobOptions.model_fields
        and error.get("type") not in ("missing", "extra_forbidden")
    ]
    if not errors or len(option_errors) != len(errors):
        return None
    return JobOptionsError.of(option_errors)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    if is_openai_path(request.url.path):
        return _answer(request, 400, "invalid_request", "", openai=validation_error(exc.errors()))
    options_error = _job_option_errors(exc.errors())
    if options_error is not None:
        detail = ErrorDetail(message=str(options_error), field=options_error.field)
        return error_response(422, "invalid_options", f"invalid job options: {options_error}", [detail])
    details = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        field = ".".join(loc[1:] if loc and loc[0] in ("query", "path", "body", "header") else loc)
        details.append(ErrorDetail(message=error.get("msg", "invalid"), field=field or None))
    return error_response(422, "invalid_request", "the request's parameters are invalid", details)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    return _answer(request, exc.status_code, code, message, headers=getattr(exc, "headers", None))


async def _client_gone(request: Request, _exc: ClientDisconnect) -> JSONResponse:
    log.info("client hung up during %s %s", request.method, request.url.path)
    return _answer(request, 400, "client_disconnected", "the client hung up before the body was complete")


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _answer(request, 500, "internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    # Starlette types every handler as taking Exception; each of these gets only its own class.
    handlers: list[tuple[type[Exception], Callable[..., Awaitable[JSONResponse]]]] = [
        (ApiError, _api_error),
        (ClientDisconnect, _client_gone),
        (RequestValidationError, _validation_error),
        (StarletteHTTPException, _http_error),
        (Exception, _unexpected_error),
    ]
    for exc_class, handler in handlers:
        app.add_exception_handler(exc_class, cast(ExceptionHandler, handler))


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI ``responses`` documenting the error shape for these statuses."""
    return {status: {"model": ErrorResponse, "description": HTTPStatus(status).phrase} for status in statuses}


def openai_error_responses(*statuses: int) -> dict[int | str, dict]:
    """The same for the OpenAI-compatible routes, whose errors have OpenAI's shape."""
    return {
        status: {"model": OpenAIErrorResponse, "description": HTTPStatus(status).phrase}
        for status in statuses
    }
