"""Planning: the grid and its bitmask board, scenarios, every policy, the live plan and moves.
"""
