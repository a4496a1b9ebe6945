"""Benchmarks: the step benchmark (step.py) and what it reads off the GPU (clocks, power, energy).
"""
