"""Fairness: LTGF accounts, the two-stage walk and standings, shared by ledger, allocator and simulator.
"""
