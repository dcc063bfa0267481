"""Benchmarks, workload generators and the fault harness behind `rota bench TARGET` (not a service).
"""
