"""Forecasting models: physical priors, ridge corrections, quantization tiers, realtime profiles.
"""
