"""genjob: batch LLM generation jobs made fast with assisted generation (speculative decoding)."""

__version__ = "0.1.0"
