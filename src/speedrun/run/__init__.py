"""Run keeping: run folders, checkpoints and resume, health and fault policy, the environment record.
"""
