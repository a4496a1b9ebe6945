"""The optimisers: Muon with Newton-Schulz on the block matrices, ZeRO-1 Adam on the rest, and which
parameter goes to which (groups.py).
"""
