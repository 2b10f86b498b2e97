"""The embedded local model, used when no other model is configured.

- `runtime`: whether it is installed (`availability`), its server's command, and
  `ModelServer`, the supervisor that runs that server as a child process.
- `server`: the server itself (`python -m core.model.local.server`), llama.cpp's
  through xllamacpp, in the child.
- `child`: `python -m core.model.local.child`, which makes the server die with Steward.
- `client`: `LocalLLM`, the same `complete()` as `LLMClient`, made useful for a tiny
  model with code (routing, constrained tool calls, composed answers).

Nothing is imported here: the server and the child are started with `-m` and must
load only what they use.
"""
