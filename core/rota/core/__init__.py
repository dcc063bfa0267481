"""The pure core: state machines, job specs, planning, fairness, detection and forecasting over plain data.

No I/O and no clock reads: no grpc, sqlalchemy, redis or protos (an import-linter contract in
.ci/run holds this). Services, `rota sim` and the benchmarks import it; it imports nothing of theirs.
"""
