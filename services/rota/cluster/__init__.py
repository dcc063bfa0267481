"""The cluster state and its one writer: jobs, job_transitions, job_arrays, gang_exits,
placements, gpu_claims, gpu_guests, nodes and gpus (docs/architecture.md, "Who owns which
table"). The services call its commands inside their own transactions; nothing else
imports `rota.cluster.models` (an import contract), and other owners read it through
`rota.cluster.queries` or the views declared in `rota.common.read_models`."""
