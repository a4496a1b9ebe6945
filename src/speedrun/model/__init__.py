"""The model: the one definition of the math (the GPT in gpt.py, the attention's function in attention.py).

A fast kernel never holds its own copy of this math: it replaces a named function of the model
(speedrun.kernels) and a test holds it to the function here.
"""
