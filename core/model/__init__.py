"""The model client: every call to a model goes through here.

- `client`: `LLMClient`, the one door to a model through litellm (retries on the
  injected clock, error wording, usage and cost); `load_litellm` imports litellm once,
  offline.
- `result`, `errors`: what a call returns, and how a failure is classified and worded
  (shared by the client and its worker processes).
- `workers`, `worker_main`: model calls in worker processes while many run at once
  (the pool in Steward's process; the worker's side, run as `python -m
  core.model.worker_main`).
- `litellm_tokenizer`, `litellm_file_ids`: two parts of litellm made to load on use
  (resident memory of `steward run`).
- `local/`: the embedded offline model (SmolLM2-135M behind llama.cpp's server).

Nothing is imported here: `python -m core.model.worker_main` and `python -m
core.model.local.server` import only what they need.
"""
