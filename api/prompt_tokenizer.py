"""The target's tokenizer as submit needs it: render chat messages, check a prompt fits the context.

The API (and the CLI, above it) hand a ``PromptTokenizer`` to the core's submit (which only knows
the small interface ``genjob.formats.tokenizing.SubmitTokenizer``), so the core never loads a
tokenizer.
Token counts use the ``tokenizers`` library on the model's ``tokenizer.json``; chat templates use
transformers' tokenizer (no torch needed). Everything loads on first use, and only from a local
directory for the context check (a hub id is checked by the worker instead). A GGUF file's tokenizer
is read once into the model cache (``model_source.local_tokenizer``, no torch either).
Must not know: the database, Celery, HTTP, the core's tables or options.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from genjob.generation.context_fit import context_problem
from genjob.generation.model_source import ModelLoadError, local_tokenizer


class ChatTemplateError(ValueError):
    """Messages could not be rendered to a prompt (no template, no tokenizer, or the template refused)."""


class PromptTokenizer:
    """Submit-time tokenizer work for the target ``model`` (hub id, local path or GGUF file, whose
    tokenizer is read into ``cache_dir``), loaded lazily.

    A template usually starts with the BOS token; when the tokenizer also adds BOS itself on
    encoding (as the worker does), the rendered text drops its own so the worker's ids carry
    exactly one, the same ids as ``apply_chat_template(tokenize=True)``.
    """

    def __init__(self, model: str, *, label: str | None = None, cache_dir: str | None = None) -> None:
        self.model = model
        self.label = label or model  # how messages name the model (the API: its allow-list name)
        self.cache_dir = cache_dir
        self._directory: str | None = None
        self._chat: Any = None
        self._chat_error: str | None = None
        self._counter: Any = None
        self._context: int | None = None
        self._counter_loaded = False

    def _location(self) -> str:
        """Where the tokenizer loads from: ``model`` itself, or a GGUF's tokenizer directory."""
        if self._directory is None:
            self._directory = local_tokenizer(self.model, self.cache_dir)
        return self._directory

    # --- chat templates ---------------------------------------------------------------------------
    def _chat_tokenizer(self) -> Any:
        if self._chat is None and self._chat_error is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                self._chat_error = (
                    "messages need transformers to render the chat template: install genjob[api]"
                )
            else:
                try:
                    self._chat = AutoTokenizer.from_pretrained(self._location(), trust_remote_code=False)
                except (OSError, ValueError, ModelLoadError) as exc:
                    reason = str(exc).replace(self.model, self.label)
                    self._chat_error = (
                        f"messages need the target's tokenizer: cannot load {self.label!r}: {reason}"
                    )
                else:
                    if not self._chat.chat_template:
                        self._chat_error = (
                            f"the tokenizer of {self.label!r} has no chat template: "
                            "send 'prompt' lines (/v1/completions) instead"
                        )
        if self._chat_error is not None:
            raise ChatTemplateError(self._chat_error)
        return self._chat

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text of chat ``messages``, with the generation prompt; ChatTemplateError if not."""
        tokenizer = self._chat_tokenizer()
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja2 errors, raise_exception() in templates, bad roles…
            raise ChatTemplateError(f"the chat template refused the messages: {exc}") from exc
        bos = tokenizer.bos_token
        if bos and text.startswith(bos):
            added = tokenizer("")["input_ids"]
            if added and added[0] == tokenizer.bos_token_id:
                text = text[len(bos) :]
        return str(text)

    # --- the context check ------------------------------------------------------------------------
    def _load_counter(self) -> None:
        self._counter_loaded = True
        try:
            directory = Path(self._location())
        except ModelLoadError:
            return  # the worker will tell
        config_file, tokenizer_file = directory / "config.json", directory / "tokenizer.json"
        if not (config_file.is_file() and tokenizer_file.is_file()):
            return
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
            from tokenizers import Tokenizer

            counter = Tokenizer.from_file(str(tokenizer_file))
        except Exception:
            return  # unreadable here: the worker will tell
        context = config.get("n_positions") or config.get("max_position_embeddings")
        if isinstance(context, int):
            self._counter, self._context = counter, context

    def context_problem(self, prompt: str, max_new_tokens: int) -> str | None:
        """Why ``prompt`` + ``max_new_tokens`` does not fit the model's context, or None if it does
        (or if the model is neither a GGUF file nor a local directory with ``config.json`` and
        ``tokenizer.json``: then the worker checks each item and fails the long ones)."""
        if not self._counter_loaded:
            self._load_counter()
        if self._counter is None or self._context is None:
            return None
        problem = context_problem(len(self._counter.encode(prompt).ids), max_new_tokens, self._context)
        return f"{problem} (model {self.label})" if problem is not None else None
