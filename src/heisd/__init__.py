"""HeiSD: hybrid speculative decoding for vision-language-action models."""

__version__ = "0.1.0"
