"""A small paged-KV inference engine for agentic batches, and the admission control that keeps it from thrashing (CONCUR)."""
