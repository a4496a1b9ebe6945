"""Results tools: statistics, A/B comparison, plots, sampling, export, evaluation, TensorBoard.
"""
