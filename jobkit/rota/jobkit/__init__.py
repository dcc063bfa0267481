"""The job kit: libraries a job author imports inside a job, beside `rota.runtime`.

- `rota.jobkit.inference`: a small paged-KV inference engine for agentic batches, with
  CONCUR's KV-cache admission window (`kv_window`, pure) and its HTTP endpoint;
- `rota.jobkit.overlap`: communication-computation overlap for model-parallel steps (Helix);
- `rota.jobkit.tuning`: hyperparameter tuning (Hydro): scaled surrogates, fused trials,
  trials in pipeline bubbles, and `rota tune`'s study driver.

None of it is a service or is imported by one (docs/architecture.md, pyproject's contracts).
"""
