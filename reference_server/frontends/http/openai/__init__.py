"""An OpenAI-compatible front end, as Triton's OpenAI front end (server/python/openai) serves one,
on the HTTP port beside the KServe v2 routes: `api.py` routes `/v1`, `completions.py` maps text
generation onto a model's inputs, `embeddings.py` embedding, `errors.py` holds OpenAI's error
answer and the reading of a request body."""

from reference_server.frontends.http.openai.api import OpenAiApi
from reference_server.frontends.http.openai.completions import DEFAULT_MAX_TOKENS
from reference_server.frontends.http.openai.errors import OpenAiError, openai_error

__all__ = ["DEFAULT_MAX_TOKENS", "OpenAiApi", "OpenAiError", "openai_error"]
