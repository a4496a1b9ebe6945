"""Kernels: each replaces a named model or optimiser function on the devices it serves, and a test
holds it to the plain-PyTorch function it replaces.
"""
