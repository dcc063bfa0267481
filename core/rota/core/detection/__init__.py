"""Detection: pipeline layouts, the 1F1B cost model, fail-slow and fail-stop verdicts and re-plans.
"""
