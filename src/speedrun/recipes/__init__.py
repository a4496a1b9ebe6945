"""Recipes: the presets and the record ladder, plain functions deriving from one another.
"""
