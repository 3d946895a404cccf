"""Generative endpoints: OpenAI-compatible chat, completions and embeddings, and Triton's generate
extension, measured per token (time to first token, inter-token latency, token counts, goodput)."""
